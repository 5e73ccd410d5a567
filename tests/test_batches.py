"""Tests of d2l_gpu.batches and load_data_fashion_mnist: arguments, devices, batches, order."""

import re

import numpy as np
import pytest
import torch
from conftest import N_TEST, N_TRAIN

from d2l_gpu.data import fashion_mnist as data
from d2l_gpu.data.fashion_mnist import (
    get_fashion_mnist_labels,
    load_data_fashion_mnist,
    read_fashion_mnist,
)

pytestmark = pytest.mark.usefixtures("data_env")


def ids(X):
    """Recover the example numbers stored in pixel (0, 0) of a batch."""
    return (X[:, 0, 0, 0] * 255).round().long().tolist()


@pytest.mark.parametrize("bad", [0, -3, 2.5, "8", True, None])
def test_batch_size_must_be_positive_int(fake_root, bad):
    with pytest.raises(ValueError, match=f"batch_size must be a positive integer, got {bad!r}"):
        load_data_fashion_mnist(bad, root=fake_root)


@pytest.mark.parametrize("kw", [{"limit": 0}, {"limit": 2.0}, {"seed": -1}, {"seed": True}])
def test_other_arguments_checked(fake_root, kw):
    with pytest.raises(ValueError, match=f"{next(iter(kw))} must be"):
        load_data_fashion_mnist(8, root=fake_root, **kw)


BAD_RESIZES = [(28,), 28.0, "28", (1, 2, 3), -1, 0, True, (28, 0), (28.0, 28), [28, "a"], {}]


@pytest.mark.parametrize("bad", BAD_RESIZES, ids=repr)
def test_resize_checked_and_named(fake_root, bad):
    message = r"resize must be None, a positive integer .* pair \(height, width\) .*got "
    with pytest.raises(ValueError, match=message + re.escape(repr(bad))):
        load_data_fashion_mnist(8, bad, root=fake_root)
    X, y = torch.zeros(2, 28, 28, dtype=torch.uint8), torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="resize must be"):
        data.DataIter(X, y, 2, resize=bad)


@pytest.mark.parametrize(
    "resize, shape",
    [(32, (32, 32)), ((20, 36), (20, 36)), ([14, 14], (14, 14)), (np.int64(16), (16, 16))],
)
def test_resize(fake_root, resize, shape):
    train_iter, test_iter = load_data_fashion_mnist(8, resize, root=fake_root)
    for it in (train_iter, test_iter):
        X, _ = next(iter(it))
        assert X.shape == (8, 1, *shape) and X.dtype == torch.float32
        assert 0 <= X.min() and X.max() <= 1


@pytest.fixture
def unread(monkeypatch):
    """Make reading the data set fail loudly: a device check must come before it."""

    def read(*args, **kwargs):
        raise AssertionError("the data set was read before the device was checked")

    monkeypatch.setattr(data, "read_fashion_mnist", read)


@pytest.mark.parametrize("device", ["meta", torch.device("meta")])
def test_meta_device_refused_before_reading(unread, device):
    with pytest.raises(ValueError, match="device 'meta' holds no data .* such as 'cpu'"):
        load_data_fashion_mnist(8, device=device)


@pytest.mark.parametrize("device", ["cuda", "cuda:99"])
def test_missing_device_refused_before_reading(unread, device):
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError, match=f"device '{device}' is not available on this machine"):
        load_data_fashion_mnist(8, device=device)


def test_unknown_device_name_refused(unread):
    with pytest.raises(ValueError, match="device 'gpu0' is not a device name PyTorch knows"):
        load_data_fashion_mnist(8, device="gpu0")


@pytest.mark.parametrize("device", [torch.device("cpu"), "cpu", None])
def test_device(fake_root, device):
    train_iter, test_iter = load_data_fashion_mnist(8, root=fake_root, device=device)
    assert train_iter.device == test_iter.device == torch.device("cpu")
    X, y = next(iter(train_iter))
    assert X.device == y.device == torch.device("cpu")


def test_batches_shapes_dtypes_scaling(fake_root):
    train_iter, test_iter = load_data_fashion_mnist(16, root=fake_root)
    assert (len(train_iter), len(test_iter)) == (4, 2)  # last partial batch kept
    assert train_iter.batch_size == 16 and train_iter.device == torch.device("cpu")
    assert train_iter.X.dtype == torch.uint8 and train_iter.X.shape == (N_TRAIN, 28, 28)
    assert train_iter.y.dtype == torch.int64
    batches = list(test_iter)
    assert [len(y) for _, y in batches] == [16, 4]
    X, y = batches[0]
    assert X.shape == (16, 1, 28, 28) and X.dtype == torch.float32 and y.dtype == torch.int64
    assert X.min() == 0 and X.max() == 1
    raw = read_fashion_mnist(fake_root)
    assert torch.equal(X[:, 0], raw["test_images"][:16].float() / 255)
    assert torch.equal(y, raw["test_labels"][:16].long())


def test_test_order_fixed(fake_root):
    _, test_iter = load_data_fashion_mnist(8, root=fake_root)
    first, second = [sum((ids(X) for X, _ in test_iter), []) for _ in range(2)]
    assert first == second == list(range(N_TEST))


def epochs(train_iter, n=3):
    """The example order of `n` successive epochs."""
    return [sum((ids(X) for X, _ in train_iter), []) for _ in range(n)]


def test_shuffle_per_epoch_reproducible(fake_root):
    train_iter, _ = load_data_fashion_mnist(8, root=fake_root, seed=1)
    orders = epochs(train_iter)
    for order in orders:
        assert sorted(order) == list(range(N_TRAIN))  # every example exactly once
    assert orders[0] != orders[1] != orders[2] and orders[0] != list(range(N_TRAIN))
    assert epochs(load_data_fashion_mnist(8, root=fake_root, seed=1)[0]) == orders
    assert epochs(load_data_fashion_mnist(8, root=fake_root, seed=2)[0]) != orders
    # each iter() is a new epoch, even before any batch is taken
    train_iter, _ = load_data_fashion_mnist(8, root=fake_root, seed=1)
    a, b = iter(train_iter), iter(train_iter)
    assert ids(next(b)[0]) == orders[1][:8] and ids(next(a)[0]) == orders[0][:8]


def test_labels_follow_images_when_shuffled(fake_root):
    train_iter, _ = load_data_fashion_mnist(8, root=fake_root, seed=3)
    for X, y in train_iter:
        assert [i % 10 for i in ids(X)] == y.tolist()


def test_seed_none_follows_torch_manual_seed(fake_root):
    torch.manual_seed(0)
    a = epochs(load_data_fashion_mnist(8, root=fake_root)[0], 1)
    torch.manual_seed(0)
    assert epochs(load_data_fashion_mnist(8, root=fake_root)[0], 1) == a


def test_limit(fake_root):
    train_iter, test_iter = load_data_fashion_mnist(8, root=fake_root, limit=30)
    assert train_iter.X.shape[0] == 30 and len(train_iter) == 4
    assert test_iter.X.shape[0] == N_TEST  # a limit above the set's size keeps it all
    assert sorted(epochs(train_iter, 1)[0]) == list(range(30))  # the first 30 examples


def test_quick_profile_caps_and_says_so(fake_root, monkeypatch, capsys):
    monkeypatch.setattr(data, "QUICK_TRAIN_LIMIT", 30)
    monkeypatch.setattr(data, "QUICK_TEST_LIMIT", 10)
    monkeypatch.setenv("D2L_GPU_PROFILE", "quick")
    train_iter, test_iter = load_data_fashion_mnist(8, root=fake_root)
    assert (len(train_iter.y), len(test_iter.y)) == (30, 10)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "30 of 50" in out and "D2L_GPU_PROFILE=full" in out
    train_iter, _ = load_data_fashion_mnist(8, root=fake_root, limit=45)  # limit= wins
    assert len(train_iter.y) == 45 and capsys.readouterr().out == ""
    monkeypatch.setenv("D2L_GPU_PROFILE", "full")
    train_iter, _ = load_data_fashion_mnist(8, root=fake_root)
    assert len(train_iter.y) == N_TRAIN and capsys.readouterr().out == ""


def test_text_labels():
    assert get_fashion_mnist_labels([0, 9]) == ["t-shirt", "ankle boot"]
    assert get_fashion_mnist_labels(torch.tensor([1, 8])) == ["trouser", "bag"]
