"""Shared test helpers: the project root, free ports, and small Fashion-MNIST-format IDX files.

`pythonpath` in pyproject.toml puts the project root and scripts/ on sys.path, so tests import
`d2l_gpu` from this checkout and the scripts (`nbtools`, ...) as modules.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from d2l_gpu.distributed import free_port  # noqa: F401 - re-exported for the tests

ROOT = Path(__file__).resolve().parent.parent


def idx_bytes(array: np.ndarray, kind: str) -> bytes:
    """Encode a uint8 array as an IDX file of `kind` ('images' or 'labels')."""
    magic = 0x803 if kind == "images" else 0x801
    return struct.pack(f">I{array.ndim}I", magic, *array.shape) + array.astype(np.uint8).tobytes()


def write_idx(folder: Path, n_train: int = 256, n_test: int = 64, seed: int = 0) -> Path:
    """Write four small Fashion-MNIST-format IDX files (random images, labels) into `folder`."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        (folder / f"{split}-images-idx3-ubyte").write_bytes(idx_bytes(images, "images"))
        (folder / f"{split}-labels-idx1-ubyte").write_bytes(idx_bytes(labels, "labels"))
    return folder


@pytest.fixture(scope="session")
def root() -> Path:
    """The project's root folder."""
    return ROOT


@pytest.fixture(scope="module")
def small_data(tmp_path_factory) -> Path:
    """A folder with a small random Fashion-MNIST (256 training, 64 test images), per module."""
    return write_idx(tmp_path_factory.mktemp("fashion-mnist"))
