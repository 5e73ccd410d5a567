"""How one device trains fast, and how `train_concise` trains: autocast's dtype, one optimizer step
with channels_last and mixed precision, learning-rate schedules, and the `Recipe` of options.
Shown in lessons 6 and 9."""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, replace

import torch
from torch import nn

from . import _checks
from ._typed import wrap_public
from .devices import try_all_gpus
from .models import init_weights, materialize
from .plotting import Animator
from .training import Timer, data_parallel, evaluate_accuracy_gpu


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


# oneDNN's ISA names from which a CPU's bfloat16 arithmetic runs in hardware (AVX512_BF16, AMX)
_ONEDNN_BF16_ISAS = (
    "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512", "AVX512_CORE_AMX",
    "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512", "ALL",
)  # fmt: skip


def native_low_precision(device) -> bool:
    """Whether `device` computes amp_dtype(device) in hardware, so that autocast can pay.

    A GPU with autocast does. A CPU does only with AVX512-BF16 or AMX units (and oneDNN allowed
    to use them, ONEDNN_MAX_CPU_ISA); elsewhere bfloat16 is emulated, and a ResNet-18 step under
    autocast was 18 times slower than in float32 (AVX2 kernels, 2026-11-29). Shown in lesson 9.
    """
    kind = _checks.device("native_low_precision: device", device).type
    if not _autocast_available(kind):
        return False
    if kind != "cpu":
        return True
    capped = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if capped and capped not in _ONEDNN_BF16_ISAS:
        return False
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # x86 only; absent elsewhere
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def make_step(
    net, optimizer, loss, device, *, channels_last=False, amp=False, scheduler=None, clip=None
):
    """Return step(X, y) -> loss as a device tensor: one optimizer update, and one step of the
    schedule if the update happened (fp16's GradScaler skips a step whose gradients overflowed,
    and reads that check back to the host; nothing else does). `clip`: the largest norm of all
    gradients together, applied to the true gradients (unscaled first under fp16)."""
    if not isinstance(net, torch.nn.Module) or not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("make_step needs a module and a torch.optim optimizer of its parameters")
    if not callable(loss) or not (isinstance(amp, bool) or isinstance(amp, torch.dtype)):
        raise TypeError(f"make_step needs a loss function, and amp True, False or a dtype: {amp!r}")
    if clip is not None and not (isinstance(clip, (int, float)) and clip > 0):
        raise ValueError(f"make_step: clip must be a positive gradient norm, not {clip!r}")
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
        stepped = True
        if scaler is not None:
            scaler.scale(l).backward()
            if clip is not None:
                scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
                torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
            scale = scaler.get_scale()
            scaler.step(optimizer)  # skipped when a gradient is inf or NaN
            scaler.update()  # ... and then the scale is lowered
            stepped = scaler.get_scale() >= scale
        else:
            l.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
            optimizer.step()
        if scheduler is not None and stepped:
            scheduler.step()
        return l.detach()

    return step


def warmup_cosine(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0, cosine: bool = False
):
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


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
