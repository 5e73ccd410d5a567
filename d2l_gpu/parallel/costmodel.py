"""The alpha-beta cost model of messages: measure it, fit it, predict collectives with it.

Shown in lesson 12. A message of n bytes costs alpha + n / beta seconds: a fixed latency alpha
(software, wake-ups, the wire's delay) plus the size over the bandwidth beta. The workers below
run in every rank of a process group (see `run_workers`) and time real messages; the formulas
predict the collectives of `collectives.py` from one fitted (alpha, beta) per link.
"""

from __future__ import annotations

import math
import queue
import statistics
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import _checks
from .._typed import wrap_public
from ..devices import synchronize
from ..distributed import rank_device
from . import worker_args
from .collectives import TIMED, open_reverse_links, ring_all_reduce


@dataclass(frozen=True)
class AlphaBeta:
    """One link: `alpha` seconds per message, `beta` bytes per second (lesson 12)."""

    alpha: float
    beta: float

    def __post_init__(self) -> None:
        _checks.number("AlphaBeta: alpha (seconds per message)", self.alpha)
        if not (isinstance(self.beta, float) and self.beta == math.inf):  # inf: a free link
            _checks.number("AlphaBeta: beta (bytes per second)", self.beta, positive=True)

    def time(self, nbytes: float) -> float:
        """Predicted seconds of one message of `nbytes` bytes over this link."""
        return self.alpha + nbytes / self.beta

    def __str__(self) -> str:
        if self.beta > 1e14:  # what fit_alpha_beta returns when size made no difference
            return f"alpha = {1e6 * self.alpha:.1f} us, beta too large to measure at these sizes"
        return f"alpha = {1e6 * self.alpha:.1f} us, beta = {self.beta / 1e9:.3f} GB/s"


def fit_alpha_beta(sizes: list[float], times: list[float], rounds: int = 20) -> AlphaBeta:
    """Fit time = alpha + size / beta in relative error, robust to outliers (lesson 12)."""
    if len(sizes) != len(times) or len(sizes) < 2:
        raise ValueError(f"need 2 or more (sizes, times) pairs, got {len(sizes)} and {len(times)}")
    n = torch.tensor(sizes, dtype=torch.float64)
    t = torch.tensor(times, dtype=torch.float64)
    if not (torch.isfinite(n).all() and torch.isfinite(t).all()):
        raise ValueError("sizes and times must be finite numbers, not NaN or inf")
    if (t <= 0).any() or (n < 0).any():
        raise ValueError("every measured time must be positive, and every size 0 or more")
    if len(set(sizes)) < 2:  # one size: any alpha fits with a matching beta
        raise ValueError(f"need at least 2 different sizes to tell alpha from beta, got {sizes}")
    scale, weight = t, torch.ones_like(t)  # first divide each equation by its measured time
    for _ in range(rounds):
        s = weight.sqrt() / scale
        A = torch.stack([s, n * s], dim=1)  # alpha * s + gamma * n * s = t * s
        alpha, gamma = torch.linalg.lstsq(A, (t * s).unsqueeze(1)).solution.squeeze(1)
        alpha, gamma = alpha.clamp(min=0.0), gamma.clamp(min=1e-15)  # neither can be negative
        scale = alpha + gamma * n  # then by the model's own prediction, not a noisy measurement,
        miss = (t / scale - 1).abs()  # and a time the model misses by over 20% weighs less
        weight = (0.2 / miss).clamp(max=1.0)
    return AlphaBeta(float(alpha), float(1 / gamma))


def ps_time(link: AlphaBeta, nbytes: float, k: int, num_servers: int = 1) -> float:
    """Seconds of `ps_push_pull` over k ranks: a server's k-1 slices in, k-1 out (lesson 12)."""
    # All servers work at once. A dedicated server (the book's CPU) makes k + 1 ranks.
    _check_model("ps_time", nbytes, link=link, k=k)
    _checks.whole("ps_time: num_servers", num_servers, most=k)
    return 2 * (k - 1) * link.time(nbytes / num_servers)


def ring_time(link: AlphaBeta, nbytes: float, k: int) -> float:
    """Seconds of `ring_all_reduce` over k ranks: 2(k-1) steps of nbytes/k (lesson 12)."""
    _check_model("ring_time", nbytes, link=link, k=k)
    return 0.0 if k == 1 else 2 * (k - 1) * link.time(nbytes / k)


def flat_ring_time(inside: AlphaBeta, between: AlphaBeta, nbytes: float, k: int) -> float:
    """Seconds of `ring_all_reduce` over links of two kinds: each step waits for the slower."""
    _check_model("flat_ring_time", nbytes, inside=inside, between=between, k=k)
    step = max(inside.time(nbytes / k), between.time(nbytes / k))  # all links move at once
    return 0.0 if k == 1 else 2 * (k - 1) * step


def hierarchical_time(
    inside: AlphaBeta, between: AlphaBeta, nbytes: float, machines: int, local_size: int
) -> float:
    """Seconds of `hierarchical_all_reduce`: reduce in, ring across, broadcast in (lesson 12)."""
    _check_model("hierarchical_time", nbytes, inside=inside, between=between)
    _check_model("hierarchical_time", nbytes, machines=machines, local_size=local_size)
    local = (local_size - 1) * inside.time(nbytes)  # the leader receives, later sends, one by one
    return 2 * local + ring_time(between, nbytes, machines)


def two_level_time(
    inside: AlphaBeta,
    between: AlphaBeta,
    nbytes: float,
    machines: int,
    local_size: int,
    nics: int = 1,
) -> float:
    """Seconds of `two_level_all_reduce`: scatter in, rings across, gather in (lesson 12)."""
    # Inside, each rank sends local_size - 1 parts of nbytes / local_size, one after another on
    # its link, twice. Across, local_size rings of nbytes / local_size share the machine's `nics`
    # network cards: each ring gets nics / local_size of a card's bandwidth (at most all of it).
    _check_model("two_level_time", nbytes, inside=inside, between=between)
    _check_model("two_level_time", nbytes, machines=machines, local_size=local_size, nics=nics)
    part = nbytes / local_size
    share = AlphaBeta(between.alpha, between.beta * min(1.0, nics / local_size))
    return 2 * (local_size - 1) * inside.time(part) + ring_time(share, part, machines)


def pipeline_time(compute: list[float], comm: list[float]) -> float:
    """Seconds until the last message ends; message i starts after compute i (lesson 12)."""
    # Compute runs back to back; messages go one at a time, in order.
    compute, comm = _checks.items("pipeline_time: compute", compute), list(comm)
    if len(compute) != len(comm):
        raise ValueError(
            f"pipeline_time: compute has {len(compute)} times but comm has {len(comm)}; "
            "give one message time per compute time"
        )
    for t in compute + comm:
        _checks.number("pipeline_time: each time", t)
    ready = done = 0.0
    for c, m in zip(compute, comm, strict=True):
        ready += c
        done = max(done, ready) + m
    return max(done, ready)


def _check_model(caller: str, nbytes, **given) -> None:
    """Refuse bytes below 0, a link that is not an AlphaBeta, a count of ranks below 1."""
    _checks.number(f"{caller}: nbytes", nbytes)
    for name, value in given.items():
        if name in ("link", "inside", "between") and not isinstance(value, AlphaBeta):
            raise TypeError(f"{caller}: {name} must be an AlphaBeta(alpha, beta), got {value!r}")
        if name not in ("link", "inside", "between"):
            _checks.whole(f"{caller}: {name}", value)


# ---- measuring, inside every rank of a process group ----------------------------------------


def sync_device(device: torch.device) -> None:
    """Wait until `device` has finished its queued work, on every backend (a no-op on the CPU)."""
    synchronize(device)  # CUDA, ROCm, XPU, MPS and DirectML alike, not CUDA alone


def time_ops(
    ops: dict,
    rounds: int = 5,
    warmup: int = 1,
    group=None,
    device=None,
    statistic=statistics.median,
) -> dict[object, float]:
    """Median (or `statistic`) over `rounds` of the slowest rank's seconds per op (lesson 12)."""
    # Every member of `group` calls it with the same ops. The ops take turns within each round
    # (interleaved), so a change in the machine's load hits all of them alike; a barrier before
    # each op starts the ranks together, and an op is done when its slowest rank is.
    if not isinstance(ops, dict) or not ops or not all(map(callable, ops.values())):
        raise TypeError(f"time_ops needs a dict of name -> function of no arguments, got {ops!r}")
    if rounds < 1 or warmup < 0:
        raise ValueError(f"time_ops needs rounds >= 1 and warmup >= 0, got {rounds}, {warmup}")
    if not callable(statistic):
        raise TypeError(f"time_ops: statistic must be a function of a list, got {statistic!r}")
    device = device or torch.device("cpu")
    names = list(ops)
    times = torch.zeros(len(names), rounds, dtype=torch.float64)
    for r in range(-warmup, rounds):
        for j, name in enumerate(names):
            dist.barrier(group=group)
            start = time.perf_counter()
            ops[name]()
            sync_device(device)
            if r >= 0:
                times[j, r] = time.perf_counter() - start
    slowest = times.to(device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    return {name: statistic(slowest[j].tolist()) for j, name in enumerate(names)}


def pingpong_worker(
    rank: int,
    world_size: int,
    sizes: list[int],
    rounds: int = 5,
    pair: tuple = (0, 1),
    statistic=statistics.median,
) -> dict:
    """Seconds of one message per size between the ranks of `pair`: half a ping-pong (lesson 12)."""
    # Every rank calls it; the ranks outside `pair` only wait at the barriers. `statistic` sums up
    # the rounds of each size: the median by default, `min` for the cheapest round.
    worker_args.pingpong(rank, world_size, sizes, rounds, pair, statistic)
    device = rank_device(rank)
    first, second = pair
    ops, inner = {}, {}
    for n in sizes:
        x = torch.zeros(max(1, n // 4), device=device)  # float32: 4 bytes a number
        inner[n] = max(1, min(8, 2**18 // max(n, 1)))  # small messages: several round trips

        def op(x=x, m=inner[n]):
            for _ in range(m):
                if rank == first:
                    dist.send(x, second)
                    dist.recv(x, second)
                elif rank == second:
                    dist.recv(x, first)
                    dist.send(x, first)

        ops[n] = op
    times = time_ops(ops, rounds, device=device, statistic=statistic)
    return {n: t / (2 * inner[n]) for n, t in times.items()}


def _step(fn, x: torch.Tensor, ranks: list[int], group, compute_s: float):
    """One timed op: optionally a sleep (the gradients being computed), then the all-reduce."""

    def op():
        if compute_s:
            time.sleep(compute_s)
        fn(x, ranks, group)

    return op


def collective_worker(rank: int, world_size: int, cases: list[tuple], rounds: int = 5) -> dict:
    """{case: seconds} of cases (algorithm, k, nbytes[, compute_s]) on ranks 0..k-1 (lesson 12)."""
    # The algorithm is a name of collectives.TIMED. With compute_s > 0 a case is a training step:
    # a sleep standing in for a device computing the gradients, then the all-reduce.
    worker_args.collective(rank, world_size, cases, rounds)
    device, out = rank_device(rank), {}
    open_reverse_links()
    dist.barrier()  # under NCCL: every rank sets up its communicator before the first message
    for k in sorted({case[1] for case in cases}):
        ranks = list(range(k))
        group = dist.new_group(ranks)  # every rank takes part in creating a group
        if rank >= k:
            continue
        ops = {}
        for case in (c for c in cases if c[1] == k):
            name, _, nbytes, *compute = case
            x = torch.ones(max(1, nbytes // 4), device=device)  # float32: 4 bytes a number
            ops[case] = _step(TIMED[name], x, ranks, group, compute[0] if compute else 0.0)
        out.update(time_ops(ops, rounds, group=group, device=device))
    return out


def _buckets(layer_bytes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Group layers, last first, into buckets of at least `bucket_bytes` (the last may be less)."""
    buckets, current, size = [], [], 0
    for i in reversed(range(len(layer_bytes))):
        current.append(i)
        size += layer_bytes[i]
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


def overlap_worker(
    rank: int,
    world_size: int,
    layer_bytes: list[int],
    compute_s: list[float],
    bucket_bytes: int,
    rounds: int = 5,
) -> dict:
    """Seconds of a backward pass and its gradients' all-reduces, 3 schedules (lesson 12)."""
    # Layer i's backward is a sleep of compute_s[i] (a device computing while the CPU is free),
    # last layer first. 'after backward' reduces each layer's gradient once all are computed;
    # 'per layer' lets a second thread reduce each one as soon as it is ready; 'buckets' does the
    # same with gradients grouped as DDP does. The backward and the all-reduces are also timed
    # alone, so that a model can predict how they combine.
    worker_args.overlap(rank, world_size, layer_bytes, compute_s, bucket_bytes, rounds)
    device = rank_device(rank)
    open_reverse_links()
    grads = [torch.ones(max(1, n // 4), device=device) for n in layer_bytes]
    buckets = _buckets(layer_bytes, bucket_bytes)
    flats = [torch.ones(sum(grads[i].numel() for i in b), device=device) for b in buckets]

    def overlapped(items: list[tuple[int, torch.Tensor]]) -> None:
        """Backward, last layer first; item (i, t) is sent as soon as layer i is done."""
        todo: queue.Queue = queue.Queue()

        def sender():
            if device.type == "cuda":
                torch.cuda.set_device(device)  # the current device is per thread
            while (item := todo.get()) is not None:
                ring_all_reduce(item)

        thread = threading.Thread(target=sender)
        thread.start()
        waiting = list(items)
        for i in reversed(range(len(grads))):
            time.sleep(compute_s[i])
            while waiting and waiting[0][0] == i:
                todo.put(waiting.pop(0)[1])
        todo.put(None)
        thread.join()

    def after_backward() -> None:
        for i in reversed(range(len(grads))):
            time.sleep(compute_s[i])
        for i in reversed(range(len(grads))):
            ring_all_reduce(grads[i])

    ops = {
        "backward alone": lambda: [time.sleep(c) for c in reversed(compute_s)],
        "layers' all-reduces alone": lambda: [ring_all_reduce(g) for g in reversed(grads)],
        "buckets' all-reduces alone": lambda: [ring_all_reduce(f) for f in flats],
        "after backward": after_backward,
        "per layer": lambda: overlapped([(i, grads[i]) for i in reversed(range(len(grads)))]),
        "buckets": lambda: overlapped([(b[-1], f) for b, f in zip(buckets, flats, strict=True)]),
    }
    return time_ops(ops, rounds, device=device)


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
