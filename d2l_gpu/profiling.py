"""Where the time of a step goes: record it with `torch.profiler`, read the trace back, draw it.

Shown in lesson 8. The profiler records every operator PyTorch runs on the host (its name, its
thread, when it started and how long it ran) and, on a CUDA device, the kernels the GPU ran
(through CUPTI). It writes them as a Chrome trace, a JSON file that https://ui.perfetto.dev (or
chrome://tracing) shows as a timeline. `trace_events` reads such a file back, `overlap_us` measures
how long two kinds of event ran at the same time, and `plot_trace` draws the timeline in the
notebook. `ddp_trace_worker` profiles one DistributedDataParallel step: gloo runs each bucket's
all-reduce on a thread of its own ("gloo:all_reduce"), so the trace shows the communication beside
the backward pass. NCCL runs it as a kernel on a stream of its own; the worker then compares the
NCCL kernels with the other kernels. That path is written for NCCL and ran only with gloo here.
`ddp_scaling_worker` times a DDP step against the same step without DDP, for scaling curves.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from . import _checks
from ._fs import replace_file
from ._typed import wrap_public
from .devices import synchronize

BACKWARD = "autograd::engine::evaluate_function"  # one event per gradient function run
ACCUMULATE = "AccumulateGrad"  # storing a gradient (DDP's hooks, and its launches, run in it)


@contextlib.contextmanager
def quiet_stderr():
    """Send what C++ code writes to file descriptor 2 to the null device for a moment."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _trace_path(caller: str, path) -> Path:
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{caller}: {path} is a folder; give a file name such as step.json")
    if not path.parent.is_dir():
        raise FileNotFoundError(
            f"{caller}: the folder {path.parent} does not exist; create it first"
        )
    return path


def profile_step(
    step: Callable[[], object],
    path: str | os.PathLike,
    *,
    device: torch.device | str | None = None,
    warmup: int = 2,
) -> list[dict]:
    """Run `step()` `warmup` times, then once under torch.profiler; save the trace to `path`."""
    _checks.callable_("profile_step: step", step, no_args=True)
    _checks.whole("profile_step: warmup", warmup, least=0)
    where = _checks.device(
        "profile_step: device", "cpu" if device is None else device, available=True
    )
    path = _trace_path("profile_step", path)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if where.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    for _ in range(warmup):  # first calls allocate, pick algorithms, build DDP's buckets
        step()
    synchronize(where)
    prof = torch.profiler.profile(activities=activities)
    with quiet_stderr():  # the profiler logs every start and stop
        prof.start()
    try:
        step()
        synchronize(where)  # the device's queued work belongs to this step
    finally:
        with quiet_stderr():
            prof.stop()
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as scratch:
        raw = Path(scratch) / "trace.json"  # the profiler writes only to a path
        prof.export_chrome_trace(str(raw))
        replace_file(path, lambda f: f.write(raw.read_bytes()))  # all or nothing, on disk
    return trace_events(path)


def trace_events(path: str | os.PathLike) -> list[dict]:
    """The timed events of a Chrome trace file: name, category, thread, start and duration (us)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace_events: no file {path}; write one with profile_step first")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(
            f"trace_events: {path} is not JSON ({error}); pass a Chrome trace"
        ) from None
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise ValueError(f"trace_events: {path} has no traceEvents list, so it is no Chrome trace")
    return [
        {"name": e["name"], "cat": e.get("cat", ""), "thread": f"{e.get('pid')}/{e.get('tid')}",
         "start": float(e["ts"]), "dur": float(e["dur"])}
        for e in events
        if isinstance(e, dict) and e.get("ph") == "X" and {"name", "ts", "dur"} <= e.keys()
    ]  # fmt: skip


Match = str | Callable[[dict], bool]


def _matcher(name: str, match: Match) -> Callable[[dict], bool]:
    if isinstance(match, str):
        return lambda event: match in event["name"]
    return _checks.callable_(name, match)


def spans(events: list[dict], match: Match) -> list[tuple[float, float]]:
    """The times (start, end) in us during which some event that `match`es runs, merged."""
    chosen = _matcher("spans: match", match)
    merged: list[list[float]] = []
    for start, end in sorted((e["start"], e["start"] + e["dur"]) for e in events if chosen(e)):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def overlap_us(events: list[dict], first: Match, second: Match) -> float:
    """Microseconds during which an event matching `first` and one matching `second` both run."""
    a, b, total, i, j = spans(events, first), spans(events, second), 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def plot_trace(events: list[dict], rows: dict[str, Match], *, ax=None, title: str = ""):
    """Draw a timeline: one row per label of `rows`, a bar wherever an event it matches runs."""
    from .plotting import plt

    if not isinstance(rows, dict) or not rows:
        raise TypeError(f"plot_trace: rows must be a dict of label -> name or test, got {rows!r}")
    found = {label: spans(events, match) for label, match in rows.items()}
    starts = [s[0][0] for s in found.values() if s]
    if not starts:
        raise ValueError(f"plot_trace: no event matches any of the rows {list(rows)}")
    t0 = min(starts)
    if ax is None:
        ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))[1]
    for y, times in enumerate(reversed(found.values())):
        ax.broken_barh([((a - t0) / 1e3, (b - a) / 1e3) for a, b in times], (y - 0.35, 0.7))
    ax.set_yticks(range(len(rows)), list(reversed(rows)))
    ax.set_xlabel("milliseconds since the first event shown")
    ax.set_title(title, fontsize="small")
    return ax


def gradient_op(event: dict) -> bool:
    """True for a backward event that computes gradients (not one that only stores them)."""
    return event["name"].startswith(BACKWARD) and ACCUMULATE not in event["name"]


def communication_and_compute(device: torch.device) -> tuple[Callable, Callable]:
    """Tests for a trace's collective events and its computing events on `device`."""
    if device.type == "cuda":  # NCCL: kernels on the GPU's streams
        return (
            lambda e: e["cat"] == "kernel" and "nccl" in e["name"].lower(),
            lambda e: e["cat"] == "kernel" and "nccl" not in e["name"].lower(),
        )
    # gloo: each all-reduce on one of gloo's threads, the backward on the caller's
    return (lambda e: e["name"] == "gloo:all_reduce"), gradient_op


def _rank_batch(rank: int, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """n random LeNet-shaped images and labels of rank `rank`'s own (its shard of a batch)."""
    generator = torch.Generator().manual_seed(rank)
    X = torch.rand(n, 1, 28, 28, generator=generator).to(device)
    return X, torch.randint(0, 10, (n,), generator=generator).to(device)


def ddp_trace_worker(rank: int, world_size: int, bucket_cap_mb: float | None, path: str) -> dict:
    """One DDP step of LeNet, profiled on rank 0 (its trace saved to `path`): what overlapped."""
    import gc

    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from .distributed import rank_device
    from .models import LeNet

    _checks.ranks("ddp_trace_worker", rank, world_size)
    if bucket_cap_mb is not None:
        _checks.number("ddp_trace_worker: bucket_cap_mb", bucket_cap_mb, positive=True)
    device = rank_device(rank)
    net = LeNet(seed=0).to(device)
    ddp = DistributedDataParallel(
        net, bucket_cap_mb=bucket_cap_mb, device_ids=[device] if device.type == "cuda" else None
    )
    X, y = _rank_batch(rank, 64, device)

    def step(model=ddp):
        net.zero_grad()
        F.cross_entropy(model(X), y).backward()

    if rank == 0:  # two steps first: DDP rebuilds its buckets after the first
        events = profile_step(step, path, device=device, warmup=2)
    else:
        for _ in range(3):
            step()
        synchronize(device)
    del step, ddp  # DDP holds reference cycles: free it before the group goes
    gc.collect()
    if rank != 0:
        return {}
    comm, compute = communication_and_compute(device)
    launches = [e["start"] for e in events if e["name"] == "c10d::allreduce_"]
    last_gradient = max(e["start"] for e in events if gradient_op(e))
    return {
        "all_reduces": len(launches),
        "launched_in_backward": sum(t < last_gradient for t in launches),
        "overlap_us": overlap_us(events, comm, compute),
        "comm_us": sum(b - a for a, b in spans(events, comm)),
    }


def ddp_scaling_worker(rank: int, world_size: int, batch_per_rank: int = 64, repeat: int = 5):
    """Median seconds of a DDP step of LeNet, and of the same step without DDP (lesson 8).

    Each rank trains on `batch_per_rank` images of its own (weak scaling: k ranks do k times the
    work of one) with one CPU thread, so that k ranks on a CPU ask for k cores."""
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from .distributed import rank_device
    from .models import LeNet
    from .perf import measure

    _checks.ranks("ddp_scaling_worker", rank, world_size)
    _checks.whole("ddp_scaling_worker: batch_per_rank", batch_per_rank)
    _checks.whole("ddp_scaling_worker: repeat", repeat)
    torch.set_num_threads(1)
    device = rank_device(rank)
    X, y = _rank_batch(rank, batch_per_rank, device)
    times = {}
    for name in ("alone", "ddp"):
        net = LeNet(seed=0).to(device)
        ids = [device] if device.type == "cuda" else None
        model = DistributedDataParallel(net, device_ids=ids) if name == "ddp" else net
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01)

        def step(model=model, optimizer=optimizer):
            optimizer.zero_grad()
            F.cross_entropy(model(X), y).backward()
            optimizer.step()

        torch.distributed.barrier()  # every rank starts each measurement together
        times[name] = measure(step, device=device, warmup=2, repeat=repeat)
    return times


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
