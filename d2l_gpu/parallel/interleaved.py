"""Interleaved and zero-bubble pipeline schedules of `torch.distributed.pipelining`: each rank
holds several stages of the model, so that the pipeline's bubble shrinks.

With p ranks and v stages per rank, the model is cut into p * v stages. The interleaved 1F1B and
interleaved zero-bubble schedules place them in a loop (rank r holds stages r, r + p, r + 2p, ...);
the zero-bubble "V" schedule places two per rank in a V (rank r holds stages r and 2p - 1 - r, so
rank 0 holds the first and the last). Zero-bubble schedules split each backward pass in two: the
gradient for the previous stage first (it is on the critical path), the weights' gradients later,
into what would be idle time.

Shown in lesson 10. Start with `run_workers(interleaved_pipeline_worker, p, work, ...)`;
every rank builds the same seeded MLP and returns its stages' parameters after training.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from .._typed import wrap_public
from ..distributed import rank_device, require_torch
from ..models import mlp
from . import worker_args
from .schedules import INTERLEAVED
from .splitting import split_stages
from .workload import Workload


def stages_of_rank(rank: int, world: int, stages_per_rank: int, layout: str) -> list[int]:
    """The stage indices a rank holds: in a loop (r, r + p, ...) or in a V (r, 2p - 1 - r)."""
    if layout == "v":
        return [rank, 2 * world - 1 - rank]
    return [rank + j * world for j in range(stages_per_rank)]


def interleaved_pipeline_worker(
    rank: int,
    world: int,
    work: Workload,
    schedule: str = "interleaved-1f1b",
    stages_per_rank: int = 2,
    num_microbatches: int = 4,
) -> dict:
    """Train work's MLP cut into world * stages_per_rank stages with an interleaved schedule and
    plain SGD; return {stage index: that stage's parameters} of this rank and, on the rank that
    holds the last stage, the mean loss of each step."""
    worker_args.interleaved(rank, world, work, schedule, stages_per_rank, num_microbatches)
    require_torch(2, 6, "the interleaved and zero-bubble schedules of torch.distributed.pipelining")
    from torch.distributed import pipelining

    device = rank_device()
    X, y = (t.to(device) for t in work.data())
    name, layout = INTERLEAVED[schedule]
    n = world * stages_per_rank
    stages = split_stages(mlp(list(work.widths or ()), work.seed, work.dtype), n)
    mine = stages_of_rank(rank, world, stages_per_rank, layout)
    modules = [stages[i].to(device) for i in mine]
    piped = [pipelining.PipelineStage(m, i, n, device) for m, i in zip(modules, mine, strict=True)]
    sched = getattr(pipelining, name)(
        piped, n_microbatches=num_microbatches, loss_fn=F.cross_entropy
    )
    losses_by_step = []
    for _ in range(work.steps):
        losses: list = []
        inputs = (X,) if 0 in mine else ()
        targets = {"target": y, "losses": losses} if n - 1 in mine else {}
        sched.step(*inputs, **targets)  # the gradients of the mean loss over the micro-batches
        with torch.no_grad():
            for p in (p for m in modules for p in m.parameters()):
                p -= work.lr * p.grad
                p.grad.zero_()
        if losses:
            losses_by_step.append(sum(x.item() for x in losses) / num_microbatches)
    return {
        "params": {
            i: [p.detach().cpu().clone() for p in m.parameters()]
            for i, m in zip(mine, modules, strict=True)
        },
        "losses": losses_by_step,
    }


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
