"""Training steps through parameter servers with a real backward pass, timed and traced (lesson 12).

`costmodel.collective_worker` times a step as a sleep (a device computing its gradients) and a
push and pull. Here every rank computes its gradients for real, with `overlap.layer_stack`, on
the cores that its messages and the server's sums also need. `server_step_worker` times, for k
ranks at once, the computation alone and a whole step with one server and with k servers, so that
a model can be fed the computation as it runs beside the others; with a folder, rank 0 (a server)
records one step of each in a trace.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from .._typed import wrap_public
from ..distributed import rank_device
from ..profiling import gradient_op, profile_step, spans
from . import worker_args
from .collectives import open_reverse_links, ps_push_pull
from .costmodel import time_ops
from .overlap import stack_and_backward, summed_gap

__all__ = ["SYNC_EVENT", "server_step_worker"]

SYNC_EVENT = "push, sum and pull"  # the trace's name for a step's synchronisation


def server_step_worker(
    rank: int,
    world_size: int,
    layers: int,
    width: int,
    batch: int,
    folder: str | None = None,
    rounds: int = 5,
) -> dict:
    """{(schedule, k): seconds} of real steps on ranks 0..k-1, k = 1..world_size (lesson 12)."""
    # Schedules: 'compute' (forward and backward only, every one of the k ranks at once), 'one
    # server' and 'k servers' (the same, then the gradients summed by ps_push_pull). Every rank
    # holds the sum of all k ranks' gradients after a step; the worker checks that too.
    worker_args.server_steps(rank, world_size, layers, width, batch, folder, rounds)
    device = rank_device(rank)
    open_reverse_links()
    dist.barrier()  # under NCCL: every rank sets up its communicator before the first message
    net, compute = stack_and_backward(layers, width, batch, rank, device)
    flat = torch.zeros(sum(p.numel() for p in net.parameters()), device=device)
    found: dict = {"seconds": {}, "rel_diff": 0.0}
    for k in range(1, world_size + 1):
        ranks = list(range(k))
        group = dist.new_group(ranks)  # every rank takes part in creating every group
        if rank >= k:
            continue
        steps = _steps(net, compute, flat, ranks)
        gap = summed_gap(list(net.parameters()), compute, steps["k servers"], group)
        found["rel_diff"] = max(found["rel_diff"], gap)
        chosen = {name: step for name, step in steps.items() if k > 1 or name == "compute"}
        times = time_ops(chosen, rounds, group=group, device=device)
        found["seconds"].update({(name, k): t for name, t in times.items()})
        if folder is not None and k == world_size:
            found["traces"] = _traced(rank, steps, folder, device)
    return found


def _steps(net: nn.Module, compute, flat: torch.Tensor, ranks: list[int]) -> dict:
    """The three schedules of one step on `ranks`, as functions of no arguments."""

    def step(servers: int):
        def run() -> None:
            compute()
            with torch.profiler.record_function(SYNC_EVENT):
                torch.cat([p.grad.flatten() for p in net.parameters()], out=flat)
                ps_push_pull(flat, servers, ranks)
                sums = flat.split([p.numel() for p in net.parameters()])
                for p, part in zip(net.parameters(), sums, strict=True):
                    p.grad.copy_(part.view_as(p))

        return run

    return {"compute": compute, "one server": step(1), "k servers": step(len(ranks))}


def _traced(rank: int, steps: dict, folder: str, device: torch.device) -> dict:
    """Rank 0 records one step of each server schedule; the others step alongside."""
    names = ("one server", "k servers")
    if rank != 0:
        for name in names:
            for _ in range(2):
                steps[name]()
        return {}
    found = {}
    for name in names:
        path = Path(folder) / f"{name.replace(' ', '-')}.json"
        events = profile_step(steps[name], path, device=device, warmup=1)
        computed, synced = spans(events, gradient_op), spans(events, SYNC_EVENT)
        found[name] = {
            "path": str(path),
            "compute_ms": (computed[-1][1] - computed[0][0]) / 1e3,
            "sync_ms": sum(b - a for a, b in synced) / 1e3,
        }
    return found


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
