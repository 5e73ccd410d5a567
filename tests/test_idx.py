"""Tests of d2l_gpu.idx through the data layer: strict parsing, gzip, bounded memory."""

import tracemalloc

import numpy as np
import pytest
import torch
from conftest import (
    FAKE,
    N_TEST,
    N_TRAIN,
    fake_fashion,
    gzip_bomb,
    idx_bytes,
    images_header,
    write_files,
)

from d2l_gpu.data import fashion_mnist as data
from d2l_gpu.data.fashion_mnist import DataError, parse_idx, read_fashion_mnist

pytestmark = pytest.mark.usefixtures("data_env")


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
