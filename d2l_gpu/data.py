"""Fashion-MNIST: find or download the files, parse them strictly, iterate in batches on a device.

Where the files come from (first match wins; a folder counts only if it holds all four files, each
gzipped or raw IDX):
  1. the `root` argument (it must exist);
  2. the folder named by the environment variable D2L_GPU_DATA (it must exist);
  3. SYSTEM_DIR, /usr/share/datasets/fashion-mnist (Debian/Ubuntu package dataset-fashion-mnist);
  4. the per-user cache, $XDG_CACHE_HOME/d2l_gpu/fashion-mnist (default ~/.cache/d2l_gpu/...);
  5. a download from MIRROR (the variable D2L_GPU_MIRROR overrides it) into that cache.
Every file is parsed strictly (magic numbers, sizes, label range). The SHA-256 of the decompressed
content is checked against SHA256 for the sources this module vouches for (SYSTEM_DIR, the cache,
downloads); files you point at yourself (root, D2L_GPU_DATA) are checked only with verify=True.
Parsed tensors are cached in-process, so loading again in a notebook is instant; treat the tensors
of read_fashion_mnist (and DataIter.X on CPU, which shares them) as read-only.
"""

from __future__ import annotations

import functools
import math
import numbers
import os
import struct
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .devices import profile
from .download import DataError, cache_dir, check_sha256, download, read_bytes

__all__ = [
    "DataError",
    "DataIter",
    "fashion_mnist_dir",
    "get_fashion_mnist_labels",
    "load_data_fashion_mnist",
    "parse_idx",
    "read_fashion_mnist",
]

MIRROR = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
DEBIAN_PACKAGE = "dataset-fashion-mnist"
FILES = {  # key in read_fashion_mnist's dict -> file name (plus .gz when gzipped)
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
SHA256 = {  # of the decompressed IDX content (`zcat file | sha256sum`): mirrors recompress
    "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
}
QUICK_TRAIN_LIMIT = 10_000  # training examples kept in the quick profile when limit is not given
QUICK_TEST_LIMIT = 2_000  # test examples kept in the quick profile when limit is not given
IMAGE_SHAPE = (28, 28)
NUM_CLASSES = 10
_IDX = {"images": (0x00000803, 3), "labels": (0x00000801, 1)}  # magic number, number of dims


def _how_to_get(mirror: str = MIRROR) -> str:
    """Say how to get the files by hand."""
    names = ", ".join(f"{name}.gz" for name in FILES.values())
    return (
        f"To get the files: download {names} from {mirror}, or install the Debian/Ubuntu package "
        f"{DEBIAN_PACKAGE} (it puts them in {SYSTEM_DIR}); then set the environment variable "
        "D2L_GPU_DATA to the folder that holds them (or pass root=)."
    )


def _bad_file(where, problem: str) -> DataError:
    """A DataError saying what is wrong with a file and what to do about it."""
    return DataError(
        f"{where}: {problem}. Replace it with a good copy (delete it to have it downloaded again "
        f"into the cache, or reinstall {DEBIAN_PACKAGE})."
    )


def parse_idx(data: bytes, kind: str, where: str | os.PathLike = "IDX data") -> np.ndarray:
    """Parse IDX `data` of `kind` 'images' (N,28,28) or 'labels' (N,) into uint8, strictly."""
    magic, ndim = _IDX[kind]
    start = 4 + 4 * ndim
    if len(data) < start:
        raise _bad_file(where, f"truncated IDX header ({len(data)} bytes, need {start})")
    got = int.from_bytes(data[:4], "big")
    if got != magic:
        raise _bad_file(where, f"not an IDX {kind} file (magic 0x{got:08x}, want 0x{magic:08x})")
    dims = struct.unpack(f">{ndim}I", data[4:start])
    if dims[0] == 0 or (kind == "images" and dims[1:] != IMAGE_SHAPE):
        raise _bad_file(where, f"wrong dimensions {dims} for Fashion-MNIST {kind}")
    size = start + math.prod(dims)
    if len(data) != size:
        problem = "truncated" if len(data) < size else "has extra bytes"
        raise _bad_file(where, f"IDX file {problem}: {len(data)} bytes, header says {size}")
    array = np.frombuffer(data, dtype=np.uint8, offset=start).reshape(dims).copy()
    if kind == "labels" and array.max() >= NUM_CLASSES:
        i = int(np.argmax(array >= NUM_CLASSES))
        raise _bad_file(where, f"label {array[i]} at index {i} is outside 0..{NUM_CLASSES - 1}")
    return array


def _find_files(folder: Path) -> dict[str, Path]:
    """Map each file name present in `folder` to its path (raw IDX preferred to .gz)."""
    found = {}
    for name in FILES.values():
        for path in (folder / name, folder / f"{name}.gz"):
            if path.is_file():
                found[name] = path
                break
    return found


def _resolve(root) -> tuple[Path, bool]:
    """Return (folder holding the four files, whether this module vouches for it)."""
    for given, what in ((root, "root"), (os.environ.get("D2L_GPU_DATA") or None, "D2L_GPU_DATA")):
        if given is None:
            continue
        folder = Path(given).expanduser()
        if not folder.is_dir():
            raise DataError(
                f"{what} {str(folder)!r} does not exist or is not a folder. {_how_to_get()}"
            )
        missing = [f"{name}[.gz]" for name in FILES.values() if name not in _find_files(folder)]
        if missing:
            raise DataError(f"{what} {str(folder)!r} lacks {', '.join(missing)}. {_how_to_get()}")
        return folder, False
    cache = cache_dir("fashion-mnist")
    for folder in (Path(SYSTEM_DIR), cache):
        if len(_find_files(folder)) == len(FILES):
            return folder, True
    _download_into(cache)
    return cache, True


def _download_into(folder: Path) -> None:
    """Download the files `folder` lacks from the mirror (D2L_GPU_MIRROR or MIRROR), verified."""
    mirror = os.environ.get("D2L_GPU_MIRROR") or MIRROR
    print(f"Downloading Fashion-MNIST from {mirror} into {folder}", file=sys.stderr)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name in FILES.values():
            if name not in _find_files(folder):
                download(f"{mirror.rstrip('/')}/{name}.gz", folder / f"{name}.gz", SHA256[name])
    except (DataError, OSError) as e:
        raise DataError(f"Fashion-MNIST is not available: {e}\n{_how_to_get(mirror)}") from e


def fashion_mnist_dir(root: str | os.PathLike | None = None) -> Path:
    """Return the folder holding the four Fashion-MNIST files, downloading them if need be."""
    return _resolve(root)[0]


def read_fashion_mnist(root=None, *, verify: bool | None = None) -> dict[str, torch.Tensor]:
    """Return the raw uint8 tensors {train_images (N,28,28), train_labels (N,), test_*}."""
    folder, vouched = _resolve(root)
    verify = vouched if verify is None else verify
    files = _find_files(folder)
    stamp = tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in files.values())
    checksums = tuple(sorted(SHA256.items())) if verify else None
    return _load(str(folder.resolve()), stamp, checksums)


@functools.lru_cache(maxsize=4)
def _load(folder: str, stamp: tuple, checksums: tuple | None) -> dict[str, torch.Tensor]:
    """Read, check and parse the four files of `folder` (cached by folder, file stamps, checks)."""
    files, raw = _find_files(Path(folder)), {}
    for key, name in FILES.items():
        data = read_bytes(files[name])
        if checksums is not None:
            check_sha256(data, dict(checksums)[name], files[name])
        raw[key] = torch.from_numpy(parse_idx(data, key.split("_")[1], files[name]))
    for split in ("train", "test"):
        n, m = len(raw[f"{split}_images"]), len(raw[f"{split}_labels"])
        if n != m:
            raise DataError(
                f"{folder}: {n} {split} images but {m} {split} labels; the files do not belong "
                "together. Replace them with a matching set."
            )
    return raw


def _check_positive_int(name: str, value) -> int:
    """Return `value` as an int, or raise ValueError naming it unless it is a positive integer."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


class DataIter:
    """Batches (X float32 (B,1,H,W) in [0,1], y int64) of uint8 images X held on one device."""

    def __init__(self, X, y, batch_size, *, shuffle=False, resize=None, seed=0):
        self.X, self.y = X, y  # uint8 (N,28,28) and int64 (N,), on the same device
        self.batch_size, self.shuffle, self.resize, self.seed = batch_size, shuffle, resize, seed
        self.device = X.device
        self.epoch = 0  # epochs started so far; epoch e's order depends only on (seed, e)

    def __len__(self):
        return math.ceil(len(self.y) / self.batch_size)

    def __iter__(self):
        n, order = len(self.y), None
        if self.shuffle:  # a new permutation each time, made on the CPU so every device agrees
            mixed = np.random.SeedSequence([self.seed, self.epoch]).generate_state(1, np.uint64)
            g = torch.Generator().manual_seed(int(mixed[0]))
            order = torch.randperm(n, generator=g).to(self.device)
        self.epoch += 1
        return self._batches(n, order)

    def _batches(self, n, order):
        for i in range(0, n, self.batch_size):
            idx = slice(i, i + self.batch_size) if order is None else order[i : i + self.batch_size]
            X = self.X[idx].unsqueeze(1).to(torch.float32).div_(255)
            if self.resize is not None:
                shrink = self.resize[0] < X.shape[-2] or self.resize[1] < X.shape[-1]
                X = F.interpolate(X, size=self.resize, mode="bilinear", antialias=shrink)
                X = X.clamp_(0, 1)
            yield X, self.y[idx]


def _resize_size(resize) -> tuple[int, int] | None:
    """Turn `resize` (None, int, or (h, w)) into None or (h, w), checking it."""
    if resize is None:
        return None
    h, w = (resize, resize) if isinstance(resize, numbers.Integral) else tuple(resize)
    return _check_positive_int("resize height", h), _check_positive_int("resize width", w)


def load_data_fashion_mnist(
    batch_size, resize=None, *, root=None, limit=None, device=None, seed=None
) -> tuple[DataIter, DataIter]:
    """Return (train_iter, test_iter) over Fashion-MNIST, the whole set held on `device`."""
    batch_size = _check_positive_int("batch_size", batch_size)
    limit = None if limit is None else _check_positive_int("limit", limit)
    size = _resize_size(resize)
    if seed is None:  # follow torch's global RNG, so torch.manual_seed makes runs repeatable
        seed = int(torch.randint(2**62, ()).item())
    elif isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
    device = torch.device("cpu" if device is None else device)
    raw = read_fashion_mnist(root)
    n_train, n_test = len(raw["train_labels"]), len(raw["test_labels"])
    if limit is not None:
        n_train, n_test = min(limit, n_train), min(limit, n_test)
    elif profile() == "quick" and (n_train > QUICK_TRAIN_LIMIT or n_test > QUICK_TEST_LIMIT):
        print(
            f"quick profile: using the first {min(QUICK_TRAIN_LIMIT, n_train)} of {n_train} "
            f"training and {min(QUICK_TEST_LIMIT, n_test)} of {n_test} test examples "
            "(set D2L_GPU_PROFILE=full for the full set)"
        )
        n_train, n_test = min(QUICK_TRAIN_LIMIT, n_train), min(QUICK_TEST_LIMIT, n_test)

    def make(split, n, shuffle):
        X = raw[f"{split}_images"][:n].to(device)
        y = raw[f"{split}_labels"][:n].to(device, torch.int64)
        return DataIter(X, y, batch_size, shuffle=shuffle, resize=size, seed=seed)

    return make("train", n_train, True), make("test", n_test, False)


def get_fashion_mnist_labels(labels):
    """Return text labels for the Fashion-MNIST dataset."""
    text_labels = [
        "t-shirt",
        "trouser",
        "pullover",
        "dress",
        "coat",
        "sandal",
        "shirt",
        "sneaker",
        "bag",
        "ankle boot",
    ]
    return [text_labels[int(i)] for i in labels]
