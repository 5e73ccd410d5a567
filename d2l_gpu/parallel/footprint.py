"""What a rank holds and sends: its device, the bytes it keeps and allocates (measured), the
collectives it calls, and its step time.

Shown in lessons 10 and 11. Held bytes come from an allocator: CUDA's statistics on a GPU; on a
CPU, whose PyTorch allocator keeps no statistics, the C library's count of the heap bytes it has
handed out (`heap_bytes`, glibc's mallinfo2: every thread's allocations, tensors' storages and the
runtime's own buffers alike), where a worker asks for it (`measure=measured_bytes`). Elsewhere,
and on a C library that keeps no count (macOS, Windows), they are counted from the tensors a rank
keeps (`tensor_bytes`), and the result says which (`held_by`). Peak bytes come from CUDA's
statistics on a GPU and on a CPU from `torch.profiler`'s record of every allocation and free.
That record misses frees made by other threads (gloo's), so it can only overstate a peak;
`train_measured` takes the smallest of two steps.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from .. import _checks, gloo
from .._typed import wrap_public
from ..devices import synchronize
from ..profiling import quiet_stderr

MiB = 2**20


class MemoryMeter:
    """Bytes allocated inside a `with` block: `peak` (highest point) and `held` (still alive)."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = _checks.device("MemoryMeter: device", device, available=True)
        self.peak = self.held = 0

    def __enter__(self) -> MemoryMeter:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            with quiet_stderr():  # the profiler logs every start and stop to stderr
                self._prof.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device) - self._base
            self.held = torch.cuda.memory_allocated(self.device) - self._base
            return
        with quiet_stderr():
            self._prof.__exit__(*exc)
        if exc[0] is not None:
            return
        # every allocation and free is one "[memory]" record of the profiler, in time order
        records = self._prof.profiler.kineto_results.events()
        records = sorted((e.start_ns(), e.nbytes()) for e in records if e.name() == "[memory]")
        total = peak = 0
        for _, nbytes in records:
            total += nbytes
            peak = max(peak, total)
        self.peak, self.held = peak, total


class CollectiveCounter(TorchDispatchMode):
    """Counts the collectives called inside a `with` block and the size of what each assembles."""

    def __init__(self):
        super().__init__()
        self.calls: dict[str, int] = {}
        self.bytes: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._opname.strip("_").replace("_base", "").replace("_into_tensor", "")
        name = name.replace("_tensor", "").replace("allgather", "all_gather")
        if func.namespace in COLLECTIVE_NAMESPACES and not name.startswith(SKIP):
            name = name.replace("allreduce", "all_reduce")
            self.calls[name] = self.calls.get(name, 0) + 1
            self.bytes[name] = self.bytes.get(name, 0) + _full_bytes(func, args)
        return func(*args, **(kwargs or {}))


COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional")
SKIP = ("wait", "barrier", "wrap")  # bookkeeping ops that move no data


def _nbytes(x) -> int:
    """Bytes of a tensor, or of all tensors in a (nested) list."""
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(item) for item in x)
    return 0


def _full_bytes(func, args) -> int:
    """The size of the whole tensor a collective reduces or assembles (not of one rank's part)."""
    if func.namespace == "_c10d_functional":  # (input, ...): a gather assembles group_size parts
        factor = args[1] if "gather" in func._opname and isinstance(args[1], int) else 1
        return _nbytes(args[0]) * factor
    return _nbytes(args[1] if "reduce_scatter" in func._opname else args[0])


def tensor_bytes(*things) -> int:
    """Bytes of the distinct storages behind the tensors in modules, optimizers, lists, objects."""
    seen: dict[int, int] = {}

    def visit(x, depth=0):
        if isinstance(x, torch.Tensor):
            local = x.to_local() if hasattr(x, "to_local") else x  # a DTensor: this rank's part
            storage = local.untyped_storage()
            seen[storage._cdata] = storage.nbytes()
            if x.grad is not None:
                visit(x.grad, depth)
        elif isinstance(x, nn.Module):
            for t in [*x.parameters(), *x.buffers()]:
                visit(t, depth)
        elif isinstance(x, torch.optim.Optimizer):
            visit(list(x.state.values()), depth)
        elif isinstance(x, dict):
            visit(list(x.values()), depth)
        elif isinstance(x, (list, tuple)):
            for item in x:
                visit(item, depth)
        elif hasattr(x, "__dict__") and depth < 1:  # e.g. a layer object holding its tensors
            visit(list(vars(x).values()), depth + 1)

    visit(list(things))
    return sum(seen.values())


def allocated_bytes(device: torch.device) -> int | None:
    """Bytes CUDA's allocator has handed out on `device` now; None elsewhere (no statistics)."""
    if _checks.device("allocated_bytes: device", device).type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]  # fmt: skip


@functools.cache
def _mallinfo2():
    """glibc's mallinfo2, or None where the C library has none (macOS, Windows, musl, old glibc)."""
    try:
        function = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError, TypeError):
        return None
    function.restype = _MallInfo2
    return function


def heap_bytes() -> int | None:
    """Bytes the C library's allocator has handed out to this process and not had back, after a
    garbage collection (glibc: chunks in use plus mmapped ones); None where it keeps no count."""
    function = _mallinfo2()
    if function is None:
        return None
    gc.collect()  # objects in reference cycles would otherwise be freed at a random later time
    info = function()
    return info.uordblks + info.hblkhd


def measured_bytes(device: torch.device) -> int | None:
    """Bytes an allocator has handed out now: CUDA's on a GPU, the C heap's on a CPU
    (`heap_bytes`); None where neither keeps a count, or where gloo's worker threads may still
    hold a finished collective's tensors (more than one: see d2l_gpu.gloo). Other ranks are
    waited for first."""
    _checks.device("measured_bytes: device", device)
    if dist.is_initialized():
        # a one-number all-reduce, not a barrier: gloo's barrier keeps the collectives that are
        # still running when it is called until it is freed itself, after we have woken up
        dist.all_reduce(torch.zeros(1, device=device))
    if device.type == "cuda":
        return allocated_bytes(device)
    if device.type != "cpu" or (dist.is_initialized() and gloo.worker_threads() != 1):
        return None
    return heap_bytes()


_WARMED: set[str] = set()  # the kinds of step this process has already run once


def warm_up_once(kind: str, step) -> None:
    """Call step() if no step of `kind` ran in this process yet: the first step of a process
    leaves the runtime's lasting buffers (the math library's, gloo's), which a baseline read
    before it would count as the model's."""
    if kind not in _WARMED:
        step()
        _WARMED.add(kind)


def held_by(measure, device: torch.device) -> str:
    """What `train_measured` reads held bytes from, in words, for `measure` on `device`."""
    if device.type == "cuda":
        return "CUDA's allocator"
    if measure is measured_bytes and device.type == "cpu" and _mallinfo2() is not None:
        return "the C heap (mallinfo2)"
    return "the tensors kept (counted)"


def train_measured(
    step, steps: int, device: torch.device, keep, baseline=None, measure=allocated_bytes
) -> dict:
    """Call step() `steps` times: warm up, measure bytes (steps 2-3), then time the rest.

    Returns what each call returned; the bytes held after the first step: `measure(device)` less
    `baseline` (read with the same `measure` before the model was built) where both are known,
    otherwise the storages of the tensors in `keep` (`held_by` says which), and those storages
    in any case (`kept`); the peak (held plus the smallest highest extra allocation of steps 2
    and 3); the median time.
    """
    _checks.callable_("train_measured: step", step)
    _checks.whole("train_measured: steps", steps)
    _checks.device("train_measured: device", device)
    outputs = [step()]  # the first step creates gradients and optimizer state
    now, kept = measure(device), tensor_bytes(keep)
    known = now is not None and baseline is not None
    held = now - baseline if known else kept
    extra, times = [], []
    for i in range(1, steps):
        if i <= 2:
            with MemoryMeter(device) as meter:
                outputs.append(step())
            extra.append(meter.peak)
            continue
        if dist.is_initialized():
            dist.barrier()
        synchronize(device)
        start = time.perf_counter()
        outputs.append(step())
        synchronize(device)
        times.append(time.perf_counter() - start)
    return {
        "outputs": outputs,
        "held": held,
        "held_by": held_by(measure, device) if known else "the tensors kept (counted)",
        "kept": kept,
        "peak": held + (min(extra) if extra else 0),
        "seconds": statistics.median(times) if times else float("nan"),
    }


def step_seconds(step, device: torch.device, repeat: int = 3, warmup: int = 1) -> float:
    """Median wall time of `step()` on this rank, the device synchronised, ranks aligned first."""
    _checks.callable_("step_seconds: step", step, no_args=True)
    _checks.device("step_seconds: device", device)
    _checks.whole("step_seconds: repeat", repeat)
    _checks.whole("step_seconds: warmup", warmup, least=0)
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeat):
        if dist.is_initialized():
            dist.barrier()
        synchronize(device)
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
