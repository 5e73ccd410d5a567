"""Tests of d2l_gpu.data, .idx and .batches: parsing, where the files come from, the iterators."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (
    FAKE,
    N_TEST,
    N_TRAIN,
    ROOT,
    fake_fashion,
    gzip_bomb,
    idx_bytes,
    images_header,
    write_files,
)

from d2l_gpu import data
from d2l_gpu.data import (
    DataError,
    fashion_mnist_dir,
    get_fashion_mnist_labels,
    load_data_fashion_mnist,
    parse_idx,
    read_fashion_mnist,
)

pytestmark = pytest.mark.usefixtures("data_env")
REAL_DIR = Path("/usr/share/datasets/fashion-mnist")
REAL_SHA256, REAL_EXAMPLES = dict(data.SHA256), dict(data.EXAMPLES)  # before data_env swaps them


@pytest.fixture
def fake_root(tmp_path):
    """A folder with a tiny, valid Fashion-MNIST (50 train, 20 test images)."""
    return write_files(tmp_path / "fake")


def ids(X):
    """Recover the example numbers stored in pixel (0, 0) of a batch."""
    return (X[:, 0, 0, 0] * 255).round().long().tolist()


# --- IDX parsing ---------------------------------------------------------------------------------


def test_parse_idx_round_trip():
    images = parse_idx(FAKE["train-images-idx3-ubyte"], "images")
    labels = parse_idx(FAKE["train-labels-idx1-ubyte"], "labels")
    assert images.shape == (N_TRAIN, 28, 28) and images.dtype == np.uint8
    assert labels.tolist() == [i % 10 for i in range(N_TRAIN)]


IMAGES, LABELS = FAKE["t10k-images-idx3-ubyte"], FAKE["t10k-labels-idx1-ubyte"]


@pytest.mark.parametrize(
    "body, kind, message",
    [
        (IMAGES[:10], "images", "truncated IDX header"),
        (IMAGES[:-1], "images", "truncated"),
        (IMAGES + b"\0", "images", "extra bytes"),
        (LABELS, "images", "magic 0x00000801"),
        (IMAGES, "labels", "magic 0x00000803"),
        (idx_bytes(np.zeros((3, 27, 28)), "images"), "images", "wrong dimensions"),
        (idx_bytes(np.zeros((0, 28, 28)), "images"), "images", "wrong dimensions"),
        (idx_bytes(np.array([1, 2, 10, 3]), "labels"), "labels", "label 10 at index 2"),
    ],
    ids=["short-header", "truncated", "extra", "magic-i", "magic-l", "dims", "empty", "label"],
)
def test_parse_idx_rejects_bad_files(body, kind, message):
    with pytest.raises(DataError, match=message) as info:
        parse_idx(body, kind, "some/file")
    assert "some/file" in str(info.value) and "good copy" in str(info.value)


def test_count_mismatch(tmp_path):
    content = dict(FAKE, **{"train-labels-idx1-ubyte": idx_bytes(np.zeros(49), "labels")})
    with pytest.raises(DataError, match="50 train images but 49 train labels"):
        read_fashion_mnist(write_files(tmp_path / "bad", content))


@pytest.mark.parametrize("damage, message", [("cut", "ends early"), ("crc", "not a valid gzip")])
def test_corrupt_gzip_names_file(tmp_path, damage, message):
    root = write_files(tmp_path / "bad")
    path = root / "train-images-idx3-ubyte.gz"
    body = path.read_bytes()
    path.write_bytes(body[:-100] if damage == "cut" else body[:-8] + b"oops" + body[-4:])
    with pytest.raises(DataError, match=message) as info:
        read_fashion_mnist(root)
    assert str(path) in str(info.value) and "good copy" in str(info.value)


def test_raw_idx_files_accepted(tmp_path):
    raw = read_fashion_mnist(write_files(tmp_path / "raw", gz=False))
    assert raw["train_images"].shape == (N_TRAIN, 28, 28)
    assert raw["test_labels"].dtype == torch.uint8 and raw["test_labels"].shape == (N_TEST,)


def test_read_is_cached_in_process_but_sees_changed_files(fake_root):
    first = read_fashion_mnist(fake_root)
    assert read_fashion_mnist(fake_root) is first
    write_files(fake_root, fake_fashion(n_train=40))
    assert read_fashion_mnist(fake_root)["train_images"].shape[0] == 40


def peak_bytes(fn) -> tuple[BaseException | None, int]:
    """Run fn(); return (what it raised, the peak of Python and numpy allocations meanwhile)."""
    tracemalloc.start()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - returned to the test
        return e, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return None, 0


@pytest.mark.parametrize(
    "announced, message", [(N_TRAIN, "extra bytes beyond"), (900_000, "header announces 900000")]
)
def test_gzip_bomb_in_a_folder_is_refused_in_bounded_memory(tmp_path, announced, message):
    bomb = gzip_bomb(images_header(announced), 64 << 20)  # 64 kB that inflate to 64 MB
    root = write_files(tmp_path / "bomb", skip={"train-images-idx3-ubyte"})
    (root / "train-images-idx3-ubyte.gz").write_bytes(bomb)
    error, peak = peak_bytes(lambda: read_fashion_mnist(root, verify=announced != N_TRAIN))
    assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB while refusing a 64 MiB bomb"
    assert isinstance(error, DataError) and message in str(error)
    assert "train-images-idx3-ubyte.gz" in str(error)


def test_header_must_announce_the_vouched_number_of_examples(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "SYSTEM_DIR", write_files(tmp_path / "system"))
    monkeypatch.setitem(data.EXAMPLES, "test", N_TEST + 1)
    with pytest.raises(DataError, match=f"announces {N_TEST} images, this file should hold 21"):
        read_fashion_mnist()


# --- checksums and where the files come from -----------------------------------------------------


def test_checksum_checked_for_system_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "SYSTEM_DIR", write_files(tmp_path / "system"))
    assert read_fashion_mnist()["train_images"].shape[0] == N_TRAIN
    monkeypatch.setitem(data.SHA256, "t10k-labels-idx1-ubyte", "0" * 64)
    with pytest.raises(DataError, match="SHA-256") as info:
        read_fashion_mnist()
    assert "t10k-labels-idx1-ubyte" in str(info.value)


def test_checksum_for_own_root_only_on_request(fake_root, monkeypatch):
    monkeypatch.setitem(data.SHA256, "train-images-idx3-ubyte", "0" * 64)
    assert read_fashion_mnist(fake_root)["train_images"].shape[0] == N_TRAIN  # parsed, not hashed
    with pytest.raises(DataError, match="SHA-256"):
        read_fashion_mnist(fake_root, verify=True)


def test_resolution_order(tmp_path, monkeypatch, data_env):
    root, env = write_files(tmp_path / "root"), write_files(tmp_path / "env")
    system, cache = write_files(tmp_path / "system"), write_files(data_env)
    monkeypatch.setenv("D2L_GPU_DATA", str(env))
    monkeypatch.setattr(data, "SYSTEM_DIR", system)
    assert fashion_mnist_dir(root) == root
    assert fashion_mnist_dir() == env
    monkeypatch.delenv("D2L_GPU_DATA")
    assert fashion_mnist_dir() == system
    (system / "t10k-labels-idx1-ubyte.gz").unlink()  # an incomplete folder is not a source
    assert fashion_mnist_dir() == cache
    assert read_fashion_mnist()["test_labels"].shape == (N_TEST,)


def test_root_and_env_must_exist(tmp_path, monkeypatch):
    missing = tmp_path / "nowhere"
    with pytest.raises(DataError, match="does not exist") as info:
        fashion_mnist_dir(missing)
    assert str(missing) in str(info.value) and "dataset-fashion-mnist" in str(info.value)
    monkeypatch.setenv("D2L_GPU_DATA", str(missing))
    with pytest.raises(DataError, match="D2L_GPU_DATA .*does not exist"):
        fashion_mnist_dir()


def test_root_must_hold_all_files(tmp_path):
    root = write_files(tmp_path / "partial", skip={"train-labels-idx1-ubyte"})
    with pytest.raises(DataError, match=r"lacks train-labels-idx1-ubyte\[\.gz\]"):
        fashion_mnist_dir(root)


@pytest.mark.parametrize("root", ["", "  "])
def test_empty_root_refused(fake_root, root, monkeypatch):
    monkeypatch.chdir(fake_root)  # where an empty root used to lead, silently
    with pytest.raises(ValueError, match="root is empty: pass the folder .* or None"):
        fashion_mnist_dir(root)
    with pytest.raises(ValueError, match="root is empty"):
        load_data_fashion_mnist(8, root=root)
    with pytest.raises(TypeError, match="root must be a folder .* got 5"):
        read_fashion_mnist(5)


UNPRIVILEGED = """
import json, sys
import d2l_gpu
from d2l_gpu import ddp
from d2l_gpu.data import DataError, read_fashion_mnist
found = {"package": d2l_gpu.__file__}
for root in sys.argv[1:]:
    try:
        read_fashion_mnist(root)
        found[root] = "read"
    except DataError as e:
        found[root] = str(e)
    except Exception as e:
        found[root] = f"{type(e).__name__}: {e}"
found["ddp"] = ddp.main(["--data-dir", sys.argv[1], "--epochs", "1"])
print(json.dumps(found))
"""


def as_user_without_access(top: Path) -> list[str]:
    """The command prefix that runs Python as a user whom permission bits bind (nobody if root)."""
    if os.geteuid() != 0:
        return [sys.executable]
    if shutil.which("setpriv") is None:
        pytest.skip("root ignores permission bits, and setpriv (to become nobody) is absent")
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable]
    if subprocess.run([*prefix, "-c", "import numpy"], cwd=top, capture_output=True).returncode:
        pytest.skip(f"user nobody cannot run {sys.executable} and its packages")
    return prefix


def test_unreadable_file_or_folder_is_a_data_error():
    """As a user without the permission (nobody, when the tests run as root): no traceback."""
    top = Path(tempfile.mkdtemp(prefix="d2l-perm-"))  # pytest's tmp_path is closed to others
    try:
        top.chmod(0o755)
        shutil.copytree(ROOT / "d2l_gpu", top / "pkg" / "d2l_gpu")  # readable, wherever ROOT is
        names = ("file000", "dir600", "dir000", "parent000/inside")
        roots = [write_files(top / name) for name in names]
        (roots[0] / "t10k-labels-idx1-ubyte.gz").chmod(0o000)
        for folder, mode in ((roots[1], 0o600), (roots[2], 0o000), (top / "parent000", 0o000)):
            folder.chmod(mode)
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(top / "pkg"), "HOME": str(top)}
        command = [*as_user_without_access(top), "-c", UNPRIVILEGED, *map(str, roots)]
        done = subprocess.run(command, env=env, cwd=top, capture_output=True, text=True, timeout=99)
    finally:
        for path in (top / "file000" / "t10k-labels-idx1-ubyte.gz", *top.iterdir()):
            path.chmod(0o755)
        shutil.rmtree(top)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["package"].startswith(str(top / "pkg"))
    label = roots[0] / "t10k-labels-idx1-ubyte.gz"
    assert found[str(roots[0])].startswith(f"cannot read {label}: permission denied")
    assert "chmod u+r FILE" in found[str(roots[0])]
    for root, folder in zip(roots[1:], [roots[1], roots[2], top / "parent000"], strict=True):
        assert found[str(root)].startswith(f"cannot look into the folder {folder}: permission")
        assert "chmod u+rx" in found[str(root)]
    assert found["ddp"] == 2 and f"cannot read {label}: permission denied" in done.stderr
    assert "Traceback" not in done.stderr


# --- the iterators -------------------------------------------------------------------------------


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


# --- the real dataset ----------------------------------------------------------------------------

real = pytest.mark.skipif(not REAL_DIR.is_dir(), reason=f"{REAL_DIR} absent")


@pytest.fixture
def real_sums(monkeypatch):
    """The real set's checksums and sizes, vouched for again."""
    monkeypatch.setattr(data, "SHA256", REAL_SHA256)
    monkeypatch.setattr(data, "EXAMPLES", REAL_EXAMPLES)


@pytest.mark.dataset
@real
def test_real_dataset_sizes_and_checksums(real_sums):
    raw = read_fashion_mnist(REAL_DIR, verify=True)
    assert raw["train_images"].shape == (60000, 28, 28) and raw["test_images"].shape[0] == 10000
    assert raw["train_labels"].bincount().tolist() == [6000] * 10


@pytest.mark.dataset
@real
def test_real_dataset_from_system_dir(real_sums, monkeypatch, capsys):
    monkeypatch.setattr(data, "SYSTEM_DIR", REAL_DIR)
    assert fashion_mnist_dir() == REAL_DIR
    train_iter, test_iter = load_data_fashion_mnist(256)
    assert (len(train_iter.y), len(test_iter.y), len(train_iter)) == (60000, 10000, 235)
    monkeypatch.setenv("D2L_GPU_PROFILE", "quick")
    train_iter, test_iter = load_data_fashion_mnist(256)
    assert (len(train_iter.y), len(test_iter.y)) == (data.QUICK_TRAIN_LIMIT, data.QUICK_TEST_LIMIT)
    assert "10000 of 60000" in capsys.readouterr().out
