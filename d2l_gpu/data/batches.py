"""Batches of Fashion-MNIST on one device: DataIter, and the checks of its arguments.

The whole set sits on the device as uint8; each batch is scaled to float32 in [0, 1] (and resized
when asked) on that device, so an epoch moves no data between host and accelerator.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch
import torch.nn.functional as F


def is_int(value) -> bool:
    """True for an integer that is not a bool (numpy integers count)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def positive_int(name: str, value) -> int:
    """Return `value` as an int, or raise ValueError naming it unless it is a positive integer."""
    if not is_int(value) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def resize_size(resize) -> tuple[int, int] | None:
    """Turn `resize` (None, int, or (height, width)) into None or (height, width), checking it."""
    if resize is None:
        return None
    pair = isinstance(resize, (tuple, list)) and len(resize) == 2
    sides = (resize, resize) if is_int(resize) else tuple(resize) if pair else ()
    if not sides or not all(is_int(side) and side > 0 for side in sides):
        raise ValueError(
            "resize must be None, a positive integer (the side of a square) or a pair "
            f"(height, width) of positive integers, got {resize!r}"
        )
    return int(sides[0]), int(sides[1])


def check_device(device) -> torch.device:
    """Return `device` as a torch.device that can hold data here, or say why it cannot."""
    if device is None:
        return torch.device("cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise ValueError(
            f"device {device!r} is not a device name PyTorch knows ({e}); pass 'cpu', 'cuda', "
            "'cuda:1', a torch.device, or None for the CPU"
        ) from None
    if device.type == "meta":
        raise ValueError(
            "device 'meta' holds no data (its tensors have shapes but no values), so its batches "
            "would mean nothing; pass a device that stores data, such as 'cpu' or d2l.try_gpu()"
        )
    try:
        torch.empty(1, device=device)
    except (RuntimeError, AssertionError) as e:  # e.g. "Torch not compiled with CUDA enabled"
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RuntimeError(
            f"device {str(device)!r} is not available on this machine ({reason}); pass "
            "d2l.try_gpu() to use an accelerator only when there is one, or 'cpu'"
        ) from None
    return device


class DataIter:
    """Batches (X float32 (B,1,H,W) in [0,1], y int64) of uint8 images X held on one device."""

    def __init__(self, X, y, batch_size, *, shuffle=False, resize=None, seed=0):
        self.X, self.y = X, y  # uint8 (N,28,28) and int64 (N,), on the same device
        self.batch_size = positive_int("batch_size", batch_size)
        self.shuffle, self.resize, self.seed = shuffle, resize_size(resize), seed
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
