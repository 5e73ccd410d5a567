"""Measuring device code: timing with synchronisation, throughput, FLOPs, data-sheet peaks.

Shown in lessons 6 and 8.
"""

from __future__ import annotations

import copy
import os
import platform
import statistics
import textwrap
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from . import _checks
from ._typed import wrap_public
from .models import has_lazy
from .training import Timer

# Dense (no sparsity) peak TFLOP/s, NVIDIA data sheets: (bf16 or fp16 tensor, fp32 non-tensor).
# Matched in order against torch.cuda.get_device_name(); a GPU not listed gets no fraction of peak.
PEAK_TFLOPS = [
    ("H100 PCIe", 756.0, 51.2),
    ("H100 NVL", 835.0, 60.0),
    ("H100", 989.4, 66.9),
    ("H200", 989.4, 66.9),
    ("A100", 312.0, 19.5),
    ("L40S", 362.0, 91.6),
    ("L40", 181.0, 90.5),
    ("L4", 121.0, 30.3),
    ("V100", 125.0, 15.7),  # fp16 only: V100 has no bf16
    ("T4", 65.0, 8.1),  # fp16 only
]


def measure(fn: Callable[[], object], *, device=None, warmup: int = 1, repeat: int = 5) -> float:
    """Median seconds of `fn()` over `repeat` runs, after `warmup` runs, synchronizing `device`."""
    _checks.callable_("measure: fn", fn, no_args=True)
    _checks.device("measure: device", device, optional=True)
    _checks.whole("measure: repeat", repeat, least=None)
    _checks.whole("measure: warmup", warmup, least=None)
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


def examples_per_second(
    data_iter: Iterable,
    device: torch.device | str | None = None,
    *,
    warmup: int = 1,
    repeat: int = 3,
) -> float:
    """Examples per second of a pass over `data_iter`, each batch moved to `device` (median)."""
    _checks.device("examples_per_second: device", device, optional=True)
    counts = []

    def one_pass():
        n = 0
        for X, y in _checks.pairs("examples_per_second: data_iter", data_iter):
            if device is not None:
                X, y = X.to(device, non_blocking=True), y.to(device, non_blocking=True)
            n += len(y)
        counts.append(n)

    secs = measure(one_pass, device=device, warmup=warmup, repeat=repeat)
    return counts[-1] / secs


def training_flops(net: nn.Module, X: torch.Tensor, y: torch.Tensor) -> int:
    """FLOPs of one forward and backward pass of `net` on (X, y), counted on shapes alone."""
    if has_lazy(net):
        raise ValueError("net has lazy layers: call d2l.materialize(net, shape) first")
    if len(X) != len(y):
        raise ValueError(f"training_flops: X has {len(X)} examples but y has {len(y)}")
    net = copy.deepcopy(net).to("meta")  # no arithmetic done, net itself untouched
    X, y = torch.empty_like(X, device="meta"), torch.empty_like(y, device="meta")
    counter = FlopCounterMode(display=False)
    with counter:
        nn.functional.cross_entropy(net(X), y).backward()
    return counter.get_total_flops()


def peak_tflops(device, low_precision: bool = True) -> float | None:
    """Data-sheet dense peak TFLOP/s of a known CUDA `device` (bf16/fp16 or fp32), else None."""
    device = _checks.device("peak_tflops: device", device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, low, fp32 in PEAK_TFLOPS:
        if key in name:
            return low if low_precision else fp32
    return None


def cpu_name() -> str:
    """The CPU's model name, e.g. 'Intel(R) Xeon(R) ...', for reports of what measured what."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:  # Linux
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device) -> str:
    """A device and what it is, for a plot title: the GPU's name, or the CPU's model, threads and
    load average (a busy machine gives slower, noisier CPU timings).

    Shown in lesson 8.
    """
    device = _checks.device("device_name: device", device)
    if device.type == "cpu":
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # not on Windows
        busy = "" if load is None else f", load {load:.1f} on {os.cpu_count()} cores"
        return f"cpu ({cpu_name()}, {torch.get_num_threads()} threads{busy})"
    get_name = getattr(getattr(torch, device.type, None), "get_device_name", None)
    return f"{device} ({get_name(device.index or 0)})" if get_name else str(device)


def measured_on(what: str, devices: Sequence) -> str:
    """A plot title: what was measured, and on which devices, wrapped at 70 characters.

    Shown in lesson 8.
    """
    if not isinstance(devices, (list, tuple)) or not devices:
        raise ValueError(f"measured_on: devices must be a non-empty list, got {devices!r:.60}")
    text = f"{what} — measured on " + "; ".join(device_name(d) for d in devices)
    return textwrap.fill(text, 70)


# The Tensor methods that hand a device's value to Python, and so make Python wait for the device
# (on a GPU: a copy to the host and a synchronisation): `.item()`, `if t`, `float(t)`, ...
HOST_READS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")


class HostWaits:
    """Count, inside `with`, how often Python read a tensor's value (`.item()`, `if t > 0`,
    `float(t)`, `.tolist()`, `.numpy()`): each is a wait for the device on a GPU, and the count is
    the same on a CPU, where nothing waits. Lesson 3's exercises check a loop with it.

    `counts` maps each method to its calls; `total` is their sum. Nested reads (`.tolist()` that
    calls `.item()` itself) count once, as the outer one."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = dict.fromkeys(HOST_READS, 0)
        self._saved: dict[str, object] = {}
        self._depth = 0

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def _counting(self, name: str, method):
        def read(tensor, *args, **kwargs):
            if self._depth == 0:
                self.counts[name] += 1
            self._depth += 1
            try:
                return method(tensor, *args, **kwargs)
            finally:
                self._depth -= 1

        return read

    def __enter__(self) -> HostWaits:
        if self._saved:
            raise RuntimeError("HostWaits: this counter is already counting; make a new one")
        for name in HOST_READS:
            self._saved[name] = torch.Tensor.__dict__.get(name)
            setattr(torch.Tensor, name, self._counting(name, getattr(torch.Tensor, name)))
        return self

    def __exit__(self, *exc) -> None:
        for name, saved in self._saved.items():
            if saved is None:
                delattr(torch.Tensor, name)  # the method lives on torch's C base class
            else:
                setattr(torch.Tensor, name, saved)
        self._saved = {}


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
