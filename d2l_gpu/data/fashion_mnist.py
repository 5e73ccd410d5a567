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
downloads), and so is the number of examples (EXAMPLES) announced by each file's header; files you
point at yourself (root, D2L_GPU_DATA) are checked only with verify=True. A gzipped file is inflated
in bounded memory: never past the size its header announces (see d2l_gpu.data.idx).
Parsed tensors are cached in-process, so loading again in a notebook is instant; treat the tensors
of read_fashion_mnist (and DataIter.X on CPU, which shares them) as read-only.
"""

from __future__ import annotations

import functools
import math
import os
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

import torch

from .._typed import wrap_public
from ..devices import profile
from .batches import DataIter, check_device, is_int, positive_int, resize_size
from .download import DataError, cache_dir, download, remove_stale_parts
from .idx import IMAGE_SHAPE, parse_idx, read_idx

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
EXAMPLES = {"train": 60_000, "test": 10_000}  # examples in each split of the vouched-for set


def _how_to_get(mirror: str = MIRROR) -> str:
    """Say how to get the files by hand."""
    names = ", ".join(f"{name}.gz" for name in FILES.values())
    return (
        f"To get the files: download {names} from {mirror}, or install the Debian/Ubuntu package "
        f"{DEBIAN_PACKAGE} (it puts them in {SYSTEM_DIR}); then set the environment variable "
        "D2L_GPU_DATA to the folder that holds them (or pass root=)."
    )


def _find_files(folder: Path) -> dict[str, Path]:
    """Map each file name present in `folder` to its path (raw IDX preferred to .gz)."""
    found = {}
    for name in FILES.values():
        for path in (folder / name, folder / f"{name}.gz"):
            try:
                if stat.S_ISREG(path.stat().st_mode):
                    found[name] = path
                    break
            except PermissionError:
                raise _unreadable(folder) from None
            except OSError:  # absent, or a path through a file
                continue
    return found


def _unreadable(folder: Path) -> DataError:
    """A DataError saying that `folder` cannot be looked into, and what to do."""
    return DataError(
        f"cannot look into the folder {folder}: permission denied. Give your user read and search "
        "access to it (for example chmod u+rx FOLDER, or ask its owner), or copy the files to a "
        "folder you can read and pass that as root= (or set D2L_GPU_DATA to it)."
    )


def _is_dir(folder: Path) -> bool:
    """True if `folder` is a folder; a DataError if its parent cannot be looked into."""
    try:
        return stat.S_ISDIR(folder.stat().st_mode)
    except PermissionError:
        raise _unreadable(folder.parent) from None
    except OSError:
        return False


def _check_root(root) -> None:
    """Refuse a `root` that is not a folder name: an empty one would mean the current folder."""
    if root is not None and not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"root must be a folder (a str or path) or None, got {root!r}")
    if root is not None and str(os.fspath(root)).strip() == "":
        raise ValueError(
            "root is empty: pass the folder that holds the Fashion-MNIST files, or None to use "
            "D2L_GPU_DATA, the system copy or the download cache"
        )


def _resolve(root) -> tuple[Path, bool]:
    """Return (folder holding the four files, whether this module vouches for it)."""
    _check_root(root)
    for given, what in ((root, "root"), (os.environ.get("D2L_GPU_DATA") or None, "D2L_GPU_DATA")):
        if given is None:
            continue
        folder = Path(given).expanduser()
        if not _is_dir(folder):
            raise DataError(
                f"{what} {str(folder)!r} does not exist or is not a folder. {_how_to_get()}"
            )
        missing = [f"{name}[.gz]" for name in FILES.values() if name not in _find_files(folder)]
        if missing:
            raise DataError(f"{what} {str(folder)!r} lacks {', '.join(missing)}. {_how_to_get()}")
        return folder, False
    cache = cache_dir("fashion-mnist")
    for name in FILES.values():  # what downloads killed mid-way left behind
        remove_stale_parts(cache / f"{name}.gz")
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
        for key, name in FILES.items():
            if name not in _find_files(folder):
                url = f"{mirror.rstrip('/')}/{name}.gz"
                split, kind = key.split("_")
                n = EXAMPLES[split]
                size = 16 + n * math.prod(IMAGE_SHAPE) if kind == "images" else 8 + n
                advice = "Nothing was saved; try again, or use another mirror."
                verify = functools.partial(
                    read_idx, kind=kind, count=n, sha256=SHA256[name], where=url, advice=advice
                )
                download(url, folder / f"{name}.gz", verify, max_bytes=2 * size + (1 << 16))
    except (DataError, OSError) as e:
        raise DataError(f"Fashion-MNIST is not available: {e}\n{_how_to_get(mirror)}") from e


def fashion_mnist_dir(root: str | os.PathLike | None = None) -> Path:
    """Return the folder holding the four Fashion-MNIST files, downloading them if need be."""
    return _resolve(root)[0]


def read_fashion_mnist(root=None, *, verify: bool | None = None) -> dict[str, torch.Tensor]:
    """Return the raw uint8 tensors {train_images (N,28,28), train_labels (N,), test_*}.

    Used by lesson 7's training script (python -m d2l_gpu.ddp).
    """
    folder, vouched = _resolve(root)
    verify = vouched if verify is None else verify
    files = _find_files(folder)
    stamp = tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in files.values())
    expected = (tuple(sorted(SHA256.items())), tuple(sorted(EXAMPLES.items()))) if verify else None
    return _load(str(folder.resolve()), stamp, expected)


@functools.lru_cache(maxsize=4)
def _load(folder: str, stamp: tuple, expected: tuple | None) -> dict[str, torch.Tensor]:
    """Read, check and parse the four files of `folder` (cached by folder, file stamps, checks)."""
    files, raw = _find_files(Path(folder)), {}
    sha256, examples = (dict(e) for e in expected) if expected else ({}, {})
    for key, name in FILES.items():
        split, kind = key.split("_")
        array = read_idx(files[name], kind, count=examples.get(split), sha256=sha256.get(name))
        raw[key] = torch.from_numpy(array)
    for split in ("train", "test"):
        n, m = len(raw[f"{split}_images"]), len(raw[f"{split}_labels"])
        if n != m:
            raise DataError(
                f"{folder}: {n} {split} images but {m} {split} labels; the files do not belong "
                "together. Replace them with a matching set."
            )
    return raw


def load_data_fashion_mnist(
    batch_size, resize=None, *, root=None, limit=None, device=None, seed=None
) -> tuple[DataIter, DataIter]:
    """Return (train_iter, test_iter) over Fashion-MNIST, the whole set held on `device`.

    Shown in lessons 5 and 6.
    """
    batch_size = positive_int("batch_size", batch_size)
    limit = None if limit is None else positive_int("limit", limit)
    size = resize_size(resize)
    if seed is None:  # follow torch's global RNG, so torch.manual_seed makes runs repeatable
        seed = int(torch.randint(2**62, ()).item())
    elif not is_int(seed) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
    device = check_device(device)  # before reading: a wrong device fails at once
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


def get_fashion_mnist_labels(labels: Iterable) -> list[str]:
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
    labels = list(labels)
    for i in labels:
        if (
            not isinstance(i, int | torch.Tensor)
            or isinstance(i, bool)
            or torch.is_tensor(i)
            and (i.numel() != 1 or i.is_floating_point())
        ):
            raise TypeError(
                f"get_fashion_mnist_labels: labels must be whole numbers, got {i!r:.40}"
            )
    if any(not 0 <= int(i) < len(text_labels) for i in labels):
        raise ValueError(f"Fashion-MNIST labels are 0 to 9, got {[int(i) for i in labels]}")
    return [text_labels[int(i)] for i in labels]


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
