"""Training utilities with the book's semantics: Timer, Accumulator, accuracy, sgd."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable

import torch
from torch import nn

from .devices import synchronize


class Timer:
    """Record multiple running times; synchronizes `device` so accelerator times are true."""

    def __init__(self, device: torch.device | str | None = None):
        self.device = device
        self.times: list[float] = []
        self.start()

    def start(self) -> None:
        """Start the timer (after the device has finished its queued work)."""
        synchronize(self.device)
        self.tik = time.perf_counter()

    def stop(self) -> float:
        """Stop the timer and record the time in a list."""
        synchronize(self.device)
        self.times.append(time.perf_counter() - self.tik)
        return self.times[-1]

    def avg(self) -> float:
        """Return the average time."""
        return sum(self.times) / len(self.times)

    def sum(self) -> float:
        """Return the sum of time."""
        return sum(self.times)

    def cumsum(self) -> list[float]:
        """Return the accumulated time."""
        out, total = [], 0.0
        for t in self.times:
            total += t
            out.append(total)
        return out


class Accumulator:
    """For accumulating sums over `n` variables."""

    def __init__(self, n: int):
        self.data = [0.0] * n

    def add(self, *args) -> None:
        """Add one value to each of the n sums."""
        self.data = [a + float(b) for a, b in zip(self.data, args, strict=True)]

    def reset(self) -> None:
        """Set every sum back to zero."""
        self.data = [0.0] * len(self.data)

    def __getitem__(self, idx: int) -> float:
        return self.data[idx]


def measure(fn: Callable[[], object], *, device=None, warmup: int = 1, repeat: int = 5) -> float:
    """Median seconds of `fn()` over `repeat` runs, after `warmup` runs, synchronizing `device`."""
    if repeat < 1 or warmup < 0:
        raise ValueError(f"measure needs repeat >= 1 and warmup >= 0, got {repeat=}, {warmup=}")
    for _ in range(warmup):
        fn()
    timer = Timer(device)
    for _ in range(repeat):
        timer.start()
        fn()
        timer.stop()
    return statistics.median(timer.times)


def accuracy(y_hat: torch.Tensor, y: torch.Tensor) -> float:
    """Compute the number of correct predictions."""
    if len(y_hat.shape) > 1 and y_hat.shape[1] > 1:
        y_hat = y_hat.argmax(axis=1)
    cmp = y_hat.type(y.dtype) == y
    return float(cmp.type(y.dtype).sum())


def evaluate_accuracy_gpu(
    net: Callable, data_iter: Iterable, device: torch.device | str | None = None
) -> float:
    """Compute the accuracy for a model on a dataset using a GPU (one host sync at the end)."""
    was_training = isinstance(net, nn.Module) and net.training
    if isinstance(net, nn.Module):
        net.eval()
        if device is None:
            device = next(iter(net.parameters())).device
    correct = total = None
    with torch.no_grad():
        for X, y in data_iter:
            X, y = X.to(device), y.to(device)
            hits = (net(X).argmax(dim=1) == y).sum()
            correct = hits if correct is None else correct + hits
            total = y.numel() if total is None else total + y.numel()
    if was_training:
        net.train()
    if total is None:
        raise ValueError(
            "evaluate_accuracy_gpu got an empty data_iter: there is nothing to evaluate"
        )
    return correct.item() / total


def sgd(params: Iterable[torch.Tensor], lr: float, batch_size: int) -> None:
    """Minibatch stochastic gradient descent."""
    with torch.no_grad():
        for param in params:
            param -= lr * param.grad / batch_size
            param.grad.zero_()
