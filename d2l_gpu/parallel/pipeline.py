"""Pipelines in real processes, one stage per rank: the schedules of `schedules` run with
send/recv (from scratch), and the same with `torch.distributed.pipelining`.

Shown in lesson 9. Start the workers with `run_workers(worker, k, ...)`; every rank builds the
same seeded model, keeps its own stage, and returns that stage's parameters after training.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.nn import functional as F

from ..data.toy import toy_data
from ..distributed import rank_device
from ..models import mlp
from .footprint import allocated_bytes, train_measured
from .schedules import SCHEDULES, stage_backward, stage_forward
from .splitting import split_stages


def _my_stage(rank: int, world: int, widths, dtype, seed, device):
    """This rank's stage of the seeded MLP, and the shape of every stage's output per example."""
    stages = split_stages(mlp(widths, seed, dtype), world)
    h, shapes = torch.zeros(1, widths[0], dtype=dtype), []
    with torch.no_grad():
        for stage in stages:
            h = stage(h)
            shapes.append(tuple(h.shape[1:]))
    return stages[rank].to(device), shapes


def _pipelined_step(stage, schedule, Xs, ys, shapes, rank, world, device, dtype) -> tuple:
    """Run this rank's actions with send/recv; return the timed events and the summed loss."""
    saved, sends, events, loss_sum = {}, [], [], 0.0
    batch = sum(len(x) for x in Xs)
    for kind, i in schedule:
        if kind == "F":
            if rank == 0:
                h = Xs[i].to(device)
            else:  # wait for the previous stage's activation
                h = torch.empty(len(Xs[i]), *shapes[rank - 1], dtype=dtype, device=device)
                dist.recv(h, src=rank - 1)
            start = time.perf_counter()
            received, out = stage_forward(stage, h, device, first=rank == 0)
            if rank == world - 1:
                out = F.cross_entropy(out, ys[i].to(device), reduction="sum") / batch
                loss_sum += out.item()
            else:
                sends.append(dist.isend(out.detach(), dst=rank + 1))
            saved[i] = (received, out)
        else:
            grad = None
            if rank < world - 1:  # wait for the next stage's gradient
                grad = torch.empty(len(Xs[i]), *shapes[rank], dtype=dtype, device=device)
                dist.recv(grad, src=rank + 1)
            start = time.perf_counter()
            grad_in = stage_backward(*saved.pop(i), grad)
            if rank > 0:
                sends.append(dist.isend(grad_in, dst=rank - 1))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        events.append((rank, kind, i, start, time.perf_counter()))
    for handle in sends:
        handle.wait()
    return events, loss_sum


def pipeline_worker(
    rank: int,
    world: int,
    widths: list[int],
    runs: list[tuple[str, int]],
    steps: int = 4,
    batch_size: int = 64,
    lr: float = 0.1,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
) -> list[dict]:
    """For each (schedule, micro-batches) in `runs`: train `steps` SGD steps, pipelined by hand.

    Returns per run: this stage's parameters, the losses (last rank), the events of the last
    step, the bytes this rank held and its peak, and the median step time (`train_measured`).
    """
    device = rank_device()
    X, y = toy_data(batch_size, widths[0], widths[-1], seed, dtype)
    job = (rank, world, widths, dtype, seed, device)
    return [_one_run(job, name, m, X, y, steps, lr) for name, m in runs]


def _one_run(job, name, m, X, y, steps, lr) -> dict:
    """Build this rank's stage afresh and train it with one schedule; see pipeline_worker."""
    rank, world, widths, dtype, seed, device = job
    schedule = SCHEDULES[name](world, m)[rank]
    Xs, ys = X.tensor_split(m), y.tensor_split(m)
    baseline = allocated_bytes(device)
    stage, shapes = _my_stage(rank, world, widths, dtype, seed, device)

    def step():
        out = _pipelined_step(stage, schedule, Xs, ys, shapes, rank, world, device, dtype)
        with torch.no_grad():
            for p in stage.parameters():
                p -= lr * p.grad
                p.grad.zero_()
        return out

    run = train_measured(step, steps, device, stage, baseline)
    return {
        "params": [p.detach().cpu().clone() for p in stage.parameters()],
        "losses": [loss for _, loss in run["outputs"]] if rank == world - 1 else [],
        "events": run["outputs"][-1][0],
        "held": run["held"],
        "peak": run["peak"],
        "seconds": run["seconds"],
    }


def torch_pipeline_worker(
    rank: int,
    world: int,
    widths: list[int],
    schedule: str = "1f1b",
    num_microbatches: int = 4,
    steps: int = 4,
    batch_size: int = 64,
    lr: float = 0.1,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
) -> dict:
    """The same training with torch.distributed.pipelining's PipelineStage and schedules."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    device = rank_device()
    X, y = toy_data(batch_size, widths[0], widths[-1], seed, dtype)
    X, y = X.to(device), y.to(device)
    baseline = allocated_bytes(device)
    stage_module = split_stages(mlp(widths, seed, dtype), world)[rank].to(device)
    stage = PipelineStage(stage_module, rank, world, device)
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    # each micro-batch's mean loss; the schedule divides the gradients by num_microbatches
    sched = kind(stage, n_microbatches=num_microbatches, loss_fn=F.cross_entropy)

    def step():
        losses: list = []
        if rank == 0:
            sched.step(X)
        elif rank == world - 1:
            sched.step(target=y, losses=losses)
        else:
            sched.step()
        with torch.no_grad():
            for p in stage_module.parameters():
                p -= lr * p.grad
                p.grad.zero_()
        return sum(x.item() for x in losses) / num_microbatches if losses else None

    run = train_measured(step, steps, device, stage_module, baseline)
    return {
        "params": [p.detach().cpu().clone() for p in stage_module.parameters()],
        "losses": run["outputs"] if rank == world - 1 else [],
        "held": run["held"],
        "peak": run["peak"],
        "seconds": run["seconds"],
    }
