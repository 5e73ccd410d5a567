"""What the book-compatibility tests share: small real Fashion-MNIST sets and class snapshots.

A chapter test calls `d2l.load_data_fashion_mnist(batch_size)` or `d2l.FashionMNIST(...)` as the
chapter does; the `fashion` fixture points D2L_GPU_DATA at the first examples of the real
Fashion-MNIST (written once per session), so the same calls read a CPU-sized set. Each test
prints the figure it asserts on; BOOK_TEST_SEED=k reruns them with another seed, which is how
the spreads quoted in the tests were measured (with OMP_NUM_THREADS=1 and the default).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from conftest import idx_bytes

from d2l_gpu.data.fashion_mnist import read_fashion_mnist

REAL_DIR = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture(scope="session")
def fashion_sets(tmp_path_factory):
    """make(n_train, n_test) -> folder with the first examples of the real set (cached)."""
    if not (REAL_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"needs the real Fashion-MNIST in {REAL_DIR} (package dataset-fashion-mnist)")
    raw = read_fashion_mnist(REAL_DIR)
    made = {}

    def make(n_train: int, n_test: int) -> Path:
        if (n_train, n_test) not in made:
            folder = tmp_path_factory.mktemp(f"fashion-{n_train}-{n_test}")
            for split, prefix, n in (("train", "train", n_train), ("test", "t10k", n_test)):
                images = raw[f"{split}_images"][:n].numpy()
                labels = raw[f"{split}_labels"][:n].numpy()
                (folder / f"{prefix}-images-idx3-ubyte").write_bytes(idx_bytes(images, "images"))
                (folder / f"{prefix}-labels-idx1-ubyte").write_bytes(idx_bytes(labels, "labels"))
            made[n_train, n_test] = folder
        return made[n_train, n_test]

    return make


@pytest.fixture
def fashion(fashion_sets, monkeypatch):
    """use(n_train, n_test): book calls that load Fashion-MNIST now read that many examples."""

    def use(n_train: int, n_test: int) -> None:
        monkeypatch.setenv("D2L_GPU_DATA", str(fashion_sets(n_train, n_test)))

    monkeypatch.setenv("D2L_GPU_LIVE_PLOTS", "0")
    torch.manual_seed(int(os.environ.get("BOOK_TEST_SEED", "0")))  # other seeds: to measure spread
    return use


@pytest.fixture
def restore():
    """restore(cls): undo, after the test, what book code adds to `cls` with add_to_class."""
    saved = []

    def keep(cls: type) -> type:
        saved.append((cls, dict(vars(cls))))
        return cls

    yield keep
    for cls, before in saved:
        for name in set(vars(cls)) - set(before):
            delattr(cls, name)
        for name, value in before.items():
            if name not in ("__dict__", "__weakref__") and vars(cls).get(name) is not value:
                setattr(cls, name, value)


@pytest.fixture
def report():
    """report(editions, acc, secs, devices): print each edition's result line; return them."""

    def say(editions, acc: float, secs: float, devices) -> list[str]:
        lines = [LINES[e](acc, secs, devices) for e in editions]
        for line in lines:
            print(line)
        return lines

    return say


def _en_line(acc: float, secs: float, devices) -> str:
    return f"test acc: {acc:.2f}, {secs:.1f} sec/epoch on {devices}"


def _zh_line(acc: float, secs: float, devices) -> str:
    return f"测试精度：{acc:.2f}，{secs:.1f}秒/轮，在{devices}"


# What differs between editions in the multi-GPU chapters: the line that reports the result.
LINES = {"en-1.0.3": _en_line, "en-0.17.6": _en_line, "zh-2.0": _zh_line}
