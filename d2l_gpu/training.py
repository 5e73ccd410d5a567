"""Training: Timer, Accumulator, accuracy, sgd (the book's), evaluation, batch scaling and
nn.DataParallel. How one device trains fast (the step, autocast, schedules) is in recipe.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch
from torch import nn

from . import _checks
from ._typed import wrap_public
from .devices import synchronize


class Timer:
    """Record multiple running times; synchronizes `device` so accelerator times are true."""

    def __init__(self, device: torch.device | str | None = None):
        _checks.device("Timer: device", device, optional=True)
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
        self.data = [0.0] * _checks.whole("Accumulator: n", n, least=0)

    def add(self, *args) -> None:
        """Add one value to each of the n sums."""
        if len(args) != len(self.data):
            raise ValueError(f"Accumulator.add got {len(args)} values for {len(self.data)} sums")
        self.data = [a + float(b) for a, b in zip(self.data, args, strict=True)]

    def reset(self) -> None:
        """Set every sum back to zero."""
        self.data = [0.0] * len(self.data)

    def __getitem__(self, idx: int) -> float:
        return self.data[idx]


def accuracy(y_hat: torch.Tensor, y: torch.Tensor) -> float:
    """Compute the number of correct predictions."""
    if y_hat.dim() == 0 or y.dim() == 0 or y_hat.shape[0] != y.shape[0]:
        raise ValueError(
            f"accuracy: y_hat and y must hold one row per example, got shapes "
            f"{tuple(y_hat.shape)} and {tuple(y.shape)}"
        )
    if len(y_hat.shape) > 1 and y_hat.shape[1] > 1:
        y_hat = y_hat.argmax(axis=1)
    cmp = y_hat.type(y.dtype) == y
    return float(cmp.type(y.dtype).sum())


def evaluate_accuracy_gpu(
    net: Callable, data_iter: Iterable, device: torch.device | str | None = None
) -> float:
    """Compute the accuracy for a model on a dataset using a GPU (one host sync at the end).

    Like the book's: an nn.Module is put in eval mode and left there (every training loop calls
    net.train() at the start of its next epoch; a net evaluated after training stays ready for
    prediction), `device` defaults to that of the net's parameters, and X may be a list of
    tensors (the book's BERT fine-tuning), each moved to `device`. Shown in lessons 5 and 6.
    """
    _checks.device("evaluate_accuracy_gpu: device", device, optional=True)
    if isinstance(net, nn.Module):
        net.eval()  # Set the model to evaluation mode
        if device is None:
            device = next(iter(net.parameters())).device
    correct = total = None
    with torch.no_grad():
        for X, y in _checks.pairs("evaluate_accuracy_gpu: data_iter", data_iter):
            if isinstance(X, (list, tuple)):
                X = [x.to(device) for x in X]
            else:
                X = X.to(device)
            y = y.to(device)
            y_hat = net(X)
            if y_hat.dim() > 1 and y_hat.shape[1] > 1:  # scores: the class is the argmax
                y_hat = y_hat.argmax(dim=1)
            hits = (y_hat.type(y.dtype) == y).sum()
            correct = hits if correct is None else correct + hits
            total = y.numel() if total is None else total + y.numel()
    if total is None:
        raise ValueError(
            "evaluate_accuracy_gpu got an empty data_iter: there is nothing to evaluate"
        )
    return correct.item() / total


def sgd(params: Iterable[torch.Tensor], lr: float, batch_size: int) -> None:
    """Minibatch stochastic gradient descent."""
    _checks.number("sgd: batch_size", batch_size, positive=True)
    _checks.number("sgd: lr", lr)
    if isinstance(params, (nn.Module, str, bytes)):
        raise TypeError("sgd: params must be the tensors to update (net.parameters()), got "
                        f"{params!r:.40}")  # fmt: skip
    with torch.no_grad():
        for param in params:
            if not isinstance(param, torch.Tensor):
                raise TypeError(f"sgd: params must hold tensors, got {param!r:.60}")
            _checks.has_grad("sgd", param)
            param -= lr * param.grad / batch_size
            param.grad.zero_()


def scale_for_devices(batch_size: int, lr: float, num_devices: int) -> tuple[int, float]:
    """Global batch and lr for `num_devices`: per-device batch constant, lr scaled linearly."""
    if num_devices < 1:
        raise ValueError(f"num_devices must be at least 1, got {num_devices}")
    return batch_size * num_devices, lr * num_devices


def data_parallel(net: nn.Module, devices: list[torch.device]) -> nn.Module:
    """nn.DataParallel over 2+ CUDA devices in `devices` (net on devices[0] first), else net."""
    if not devices:
        raise ValueError("data_parallel: devices is empty; give at least one, e.g. [d2l.try_gpu()]")
    first = torch.device(devices[0])
    where = {p.device for p in net.parameters()}
    if where != {first} and not (first.index is None and {d.type for d in where} == {first.type}):
        raise ValueError(
            f"the parameters of net are on {sorted(map(str, where))}, not on devices[0]={first}: "
            "nn.DataParallel needs them there; call net.to(devices[0]) first"
        )
    ids = [torch.device(d) for d in devices if torch.device(d).type == "cuda"]
    if len(ids) < 2:  # nothing to split: DataParallel would just call net (knows only CUDA)
        return net
    return nn.DataParallel(net, device_ids=ids)


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
