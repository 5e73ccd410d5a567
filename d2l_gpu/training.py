"""Training: Timer, Accumulator, accuracy, sgd (the book's), the training step, schedules, loops."""

from __future__ import annotations

import contextlib
import math
import statistics
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, replace

import torch
from torch import nn

from . import _checks
from .devices import synchronize, try_all_gpus
from .models import init_weights, materialize
from .plotting import Animator


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
        for X, y in data_iter:
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
    with torch.no_grad():
        for param in params:
            _checks.has_grad("sgd", param)
            param -= lr * param.grad / batch_size
            param.grad.zero_()


def scale_for_devices(batch_size: int, lr: float, num_devices: int) -> tuple[int, float]:
    """Global batch and lr for `num_devices`: per-device batch constant, lr scaled linearly."""
    if num_devices < 1:
        raise ValueError(f"num_devices must be at least 1, got {num_devices}")
    return batch_size * num_devices, lr * num_devices


def data_parallel(net: nn.Module, devices) -> nn.Module:
    """nn.DataParallel over 2+ CUDA devices in `devices` (net on devices[0] first), else net."""
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


def _autocast_available(kind: str) -> bool:
    """Whether this PyTorch has autocast for device type `kind` (MPS only from 2.5 on)."""
    if kind == "privateuseone":  # torch_directml accepts autocast but computes in float32
        return False
    check = getattr(torch.amp, "is_autocast_available", None)
    return check(kind) if check is not None else kind in ("cpu", "cuda")


def amp_dtype(device) -> torch.dtype | None:
    """bf16 where the device computes in it, else fp16 (needs a GradScaler); None: no autocast.

    None, with a warning, where this PyTorch has no autocast for the device (DirectML; MPS before
    PyTorch 2.5): training there stays in float32. Shown in lesson 9.
    """
    kind = _checks.device("amp_dtype: device", device).type
    if not _autocast_available(kind):
        warnings.warn(
            f"PyTorch {torch.__version__} has no mixed precision (autocast) for '{kind}' "
            "devices: training stays in float32",
            stacklevel=2,
        )
        return None
    if kind == "cuda":
        # NVIDIA: bf16 from Ampere (8.x) on; ROCm builds report the AMD arch (9+), all with bf16
        native = torch.cuda.get_device_capability(device)[0] >= 8
        return torch.bfloat16 if native else torch.float16
    return torch.float16 if kind == "mps" else torch.bfloat16


def make_step(net, optimizer, loss, device, *, channels_last=False, amp=False, scheduler=None):
    """Return step(X, y) -> loss as a device tensor (no host sync): one optimizer update."""
    device = torch.device(device)
    dtype = (amp_dtype(device) if amp is True else amp) or None
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
    fmt = torch.channels_last if channels_last else torch.contiguous_format

    def step(X, y):
        X = X.to(device, non_blocking=True).contiguous(memory_format=fmt)
        y = y.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        # no autocast at all without amp: PyTorch 2.4 rejects even a disabled one on MPS
        with torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext():
            l = loss(net(X), y)
        if scaler is not None:
            scaler.scale(l).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            l.backward()
            optimizer.step()
        if scheduler is not None:
            scheduler.step()
        return l.detach()

    return step


def warmup_cosine(optimizer, total_steps: int, warmup_steps: int = 0, cosine: bool = False):
    """LambdaLR: linear warm-up over `warmup_steps`, then constant or cosine decay to zero."""

    def factor(i):
        if i < warmup_steps:
            return (i + 1) / warmup_steps
        if not cosine:
            return 1.0
        done = (i - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, done)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@dataclass(frozen=True)
class Recipe:
    """How `train_concise` trains: each field one option, all off by default."""

    shape: tuple[int, ...] = (1, 1, 28, 28)  # one input's shape, to give lazy layers theirs
    channels_last: bool = False  # NHWC layout for convolutions
    amp: bool | torch.dtype = False  # autocast: True picks bf16 or fp16 for the device
    sync_every_step: bool = False  # read the loss with .item() every step (the book's way)
    compile: bool = False  # torch.compile the network (one device only)
    warmup_steps: int = 0  # linear learning-rate warm-up
    cosine: bool = False  # cosine decay after the warm-up
    init: Callable[[nn.Module], None] | None = init_weights  # applied to every layer
    plot: bool = True  # draw the training curves
    verbose: bool = True  # print the result line


def train_concise(
    net: nn.Module,
    train_iter: Iterable,
    test_iter: Iterable,
    num_epochs: int,
    lr: float,
    devices=None,
    recipe: Recipe | None = None,
    **options,
) -> dict:
    """Train `net` with nn.DataParallel on `devices`; return test acc, median s/epoch, images/s.

    Options come as a `Recipe`, as keywords (`channels_last=True`), or both (keywords win).
    Shown in lesson 6.
    """
    try:
        r = replace(recipe or Recipe(), **options)
    except TypeError:
        known = sorted(f.name for f in fields(Recipe))
        unknown = sorted(set(options) - set(known))
        raise TypeError(f"train_concise got unknown options {unknown}; it knows {known}") from None
    _checks.loop("train_concise", net, train_iter, num_epochs)
    devices = _checks.devices("train_concise: devices", devices or try_all_gpus())
    if r.compile and len(devices) > 1:
        raise ValueError("compile=True needs a single device; for several, use DDP (lesson 7)")
    net.to(devices[0])  # nn.DataParallel requires the module on devices[0]
    materialize(net, r.shape, devices[0])  # lazy layers get their shapes before anything else
    if r.init is not None:
        net.apply(r.init)  # every conv, lazy ones included
    if r.channels_last:
        net.to(memory_format=torch.channels_last)
    model = data_parallel(torch.compile(net) if r.compile else net, devices)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    scheduler = warmup_cosine(optimizer, num_epochs * len(train_iter), r.warmup_steps, r.cosine)
    step = make_step(
        model,
        optimizer,
        nn.CrossEntropyLoss(),
        devices[0],
        channels_last=r.channels_last,
        amp=r.amp,
        scheduler=scheduler,
    )
    legend = ["train loss", "test acc"]
    animator = Animator(xlabel="epoch", xlim=[1, num_epochs], legend=legend) if r.plot else None
    timer, n, accs, losses = Timer(devices[0]), 0, [], []
    for epoch in range(num_epochs):
        model.train()
        total, seen = 0.0, 0
        timer.start()
        for X, y in train_iter:
            l = step(X, y) * len(y)
            total = total + (l.item() if r.sync_every_step else l)  # .item() waits for the GPU
            seen += len(y)
        losses.append(float(total) / seen)
        timer.stop()
        n += seen
        accs.append(evaluate_accuracy_gpu(model, test_iter, devices[0]))
        if animator is not None:
            animator.add(epoch + 1, (losses[-1], accs[-1]))
    if animator is not None:
        animator.show()
    result = {
        "test_acc": accs[-1],
        "train_loss": losses[-1],
        "sec_per_epoch": statistics.median(timer.times),  # not skewed by a compiling epoch
        "images_per_sec": n / num_epochs / statistics.median(timer.times),
        "epoch_times": timer.times,
        "test_accs": accs,
        "train_losses": losses,
        "devices": [str(d) for d in devices],
    }
    if r.verbose:
        secs = result["sec_per_epoch"]
        print(f"test acc: {accs[-1]:.2f}, {secs:.1f} sec/epoch on {result['devices']}")
    return result
