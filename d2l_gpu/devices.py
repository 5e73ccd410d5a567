"""Compute devices: naming them, counting them, picking one, and the run profile.

Device-agnostic: from PyTorch 2.6 on, the current accelerator comes from ``torch.accelerator``
(CUDA, including ROCm builds, which appear as ``cuda``; Apple ``mps``; Intel ``xpu``). Older
PyTorch (2.4 and 2.5, which torch-directml needs) has no ``torch.accelerator``: there we ask
``torch.cuda``, ``torch.backends.mps`` and ``torch.xpu`` in turn. DirectML comes from the optional
``torch_directml`` package when it is installed; its devices are of type ``privateuseone``.
Nothing is queried at import time. Shown in lesson 1.
"""

from __future__ import annotations

import functools
import importlib
import numbers
import os
from typing import Any

import torch

from . import _checks
from ._typed import wrap_public

PROFILES = ("quick", "full", "auto")
DIRECTML = "privateuseone"  # the device type that torch_directml registers

INSTALL_HINT = (
    "To use an accelerator, install a PyTorch build for it (https://pytorch.org/get-started/"
    "locally/): NVIDIA - a CUDA build and the NVIDIA driver; AMD - a ROCm build (Linux, or WSL 2 "
    "with a recent Radeon card); Apple silicon - the standard macOS build (MPS); Intel - an XPU "
    "build; Windows with any DirectX 12 GPU - `pip install torch-directml`."
)


@functools.cache
def _directml():
    """The torch_directml module, or None when it is not installed or cannot load."""
    try:
        return importlib.import_module("torch_directml")
    except (ImportError, OSError):  # OSError: its Linux build outside WSL lacks libd3d12.so
        return None


def _legacy_type() -> str | None:
    """The accelerator type on a PyTorch without torch.accelerator (before 2.6), or None."""
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return "xpu"
    return None


def _accel_type() -> str | None:
    """Device type of the current accelerator ('cuda', 'mps', 'xpu', ...) or None."""
    acc = getattr(torch, "accelerator", None)
    if acc is not None and acc.is_available():
        return acc.current_accelerator().type
    kind = _legacy_type() if acc is None else None
    if kind is not None:
        return kind
    if _directml() is not None and _directml().is_available():
        return DIRECTML
    return None


def _accel_count() -> int:
    """Number of devices of the current accelerator (0 when there is none)."""
    kind = _accel_type()
    if kind is None:
        return 0
    if kind == DIRECTML:
        return _directml().device_count()
    acc = getattr(torch, "accelerator", None)
    if acc is not None:
        return acc.device_count()
    if kind == "mps":
        return 1  # one Apple GPU; torch.mps.device_count() only exists in newer PyTorch
    return getattr(torch, kind).device_count()


def accelerator_type() -> str | None:
    """The accelerator's type ('cuda', 'mps', 'xpu', ...), None on a CPU. Shown in lesson 1."""
    return _accel_type()


def _index(caller: str, i) -> None:
    """Refuse a device index that is not a whole number >= 0, naming `caller`."""
    if isinstance(i, bool) or not isinstance(i, numbers.Integral):
        raise TypeError(f"{caller}({i!r}): a device index is a whole number such as 0 or 1")
    if i < 0:
        raise ValueError(f"{caller}({i}): devices are numbered from 0; give an index 0 or more")


def cpu() -> torch.device:
    """Return the CPU device. Shown in lesson 1."""
    return torch.device("cpu")


def gpu(i: int = 0) -> torch.device:
    """Name accelerator device i ('cuda' where there is none), unchecked. Shown in lesson 1."""
    _index("gpu", i)
    return torch.device(f"{_accel_type() or 'cuda'}:{i}")


def num_gpus() -> int:
    """Return the number of accelerator devices (GPUs) available. Shown in lesson 1."""
    return _accel_count()


def try_gpu(i: int = 0, *, required: bool = False) -> torch.device:
    """gpu(i) if it exists, else cpu() (required=True: raise, saying why). Shown in lesson 1."""
    _index("try_gpu", i)
    if num_gpus() >= i + 1:
        return gpu(i)
    if required:
        found = f"{num_gpus()} {accelerator_type() or 'accelerator'} device(s)"
        raise RuntimeError(
            f"try_gpu({i}, required=True): there is no device {i}; this machine has {found} "
            f"(numbered from 0). {INSTALL_HINT}"
        )
    return cpu()


def try_all_gpus() -> list[torch.device]:
    """Return all accelerator devices, or [cpu()] if there is none. Shown in lesson 1."""
    return [gpu(i) for i in range(num_gpus())] or [cpu()]


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for all work queued on `device` (default: the accelerator). Shown in lesson 3."""
    kind = (
        _checks.device("synchronize: device", device).type if device is not None else _accel_type()
    )
    if kind in (None, "cpu", "meta"):
        return
    acc = getattr(torch, "accelerator", None)
    if acc is not None and acc.is_available() and kind == acc.current_accelerator().type:
        acc.synchronize(device)
    elif kind == DIRECTML:
        _read_back(device if device is not None else gpu(0))
    elif kind == "mps":
        torch.mps.synchronize()  # one device, no argument
    elif hasattr(getattr(torch, kind, None), "synchronize"):
        getattr(torch, kind).synchronize(device)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is an allocator's out-of-memory error, on any backend. Shown in lesson 2."""
    if isinstance(error, torch.OutOfMemoryError):  # CUDA, ROCm, XPU
        return True
    message = str(error).lower()  # MPS, DirectML and the CPU raise a plain RuntimeError
    # the CPU allocator says "can't allocate memory" on Linux and macOS, "not enough memory" on
    # Windows; DirectML "not enough GPU video memory"
    signs = ("out of memory", "not enough gpu video memory", "can't allocate memory",
             "not enough memory")  # fmt: skip
    return isinstance(error, RuntimeError) and any(sign in message for sign in signs)


def _read_back(device: torch.device | str) -> None:
    """Copy one value from `device` to the host: waits for the work queued on it before."""
    # torch_directml has no synchronize(); its queue runs in order, so a read-back waits
    torch.zeros((), device=device).item()


def _device_lines(kind: str, i: int) -> list[str]:
    """Name, memory and capability of accelerator device i, as far as PyTorch can tell."""
    gib = 2**30
    mod: Any = getattr(torch, kind, None)
    name = mod.get_device_name(i) if hasattr(mod, "get_device_name") else kind
    if kind == "mps":
        name = "Apple GPU (Metal Performance Shaders)"
    lines = [f"{kind}:{i}  {name}"]
    if hasattr(mod, "mem_get_info"):
        try:
            free, total = mod.mem_get_info(i)
            lines.append(f"    memory: {total / gib:.1f} GiB total, {free / gib:.1f} GiB free")
        except (RuntimeError, TypeError):
            pass
    if kind == "mps" and hasattr(mod, "recommended_max_memory"):
        lines.append(
            f"    memory: shares host RAM; {mod.recommended_max_memory() / gib:.1f} GiB usable"
        )
    if kind == "cuda":
        props = torch.cuda.get_device_properties(i)
        if torch.version.hip:
            lines.append(f"    AMD ROCm {torch.version.hip}, arch {props.gcnArchName}")
        else:
            lines.append(
                f"    compute capability {props.major}.{props.minor}, CUDA {torch.version.cuda}"
            )
        lines.append(f"    {props.multi_processor_count} multiprocessors")
    return lines


def _directml_lines(i: int) -> list[str]:
    """Name of DirectML device i (torch_directml tells no memory or capability)."""
    name = _directml().device_name(i) or "DirectML device"
    return [f"{gpu(i)}  {name} (DirectML; no torch.compile, autocast or distributed backend)"]


def devices_report() -> str:
    """The compute devices as PyTorch sees them, a portable nvidia-smi. Shown in lesson 1."""
    lines = [f"PyTorch {torch.__version__}; CPU: {os.cpu_count()} logical cores (device 'cpu')"]
    kind, n = _accel_type(), num_gpus()
    if n == 0 or kind is None:
        lines.append("No accelerator found: every lesson runs on the CPU, in the quick profile.")
        lines.append(INSTALL_HINT)
        return "\n".join(lines)
    lines.append(f"{n} accelerator device(s) of type '{kind}':")
    for i in range(n):
        lines += _device_lines(kind, i) if kind != DIRECTML else _directml_lines(i)
    return "\n".join(lines)


def profile() -> str:
    """The run profile, 'full' or 'quick', from D2L_GPU_PROFILE. Shown in lesson 1."""
    value = os.environ.get("D2L_GPU_PROFILE", "auto").strip().lower() or "auto"
    if value not in PROFILES:
        raise ValueError(
            f"D2L_GPU_PROFILE={value!r} is not a profile; set it to one of {', '.join(PROFILES)} "
            "(auto: full when an accelerator is present, quick otherwise)."
        )
    if value == "auto":
        return "full" if num_gpus() > 0 else "quick"
    return value


def by_profile(quick, full):
    """Return `quick` or `full`, whichever matches the current profile. Shown in lesson 1."""
    return full if profile() == "full" else quick


def describe_profile() -> str:
    """One line saying which profile this run uses and why. Shown in lesson 1."""
    setting = os.environ.get("D2L_GPU_PROFILE", "auto") or "auto"
    p = profile()
    if setting.strip().lower() != "auto":
        why = f"set by D2L_GPU_PROFILE={setting}"
    elif num_gpus() > 0:
        why = f"auto: {num_gpus()} '{accelerator_type()}' device(s) found"
    else:
        why = "auto: no accelerator found"
    what = "the real lesson" if p == "full" else "a short, honest version with less data"
    return f"profile: {p} ({why}) -> {what}"


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
