"""Pipelines in real processes, one stage per rank: the schedules of `schedules` run with
send/recv (from scratch), and the same with `torch.distributed.pipelining`.

Shown in lesson 10. Start the workers with `run_workers(worker, k, ...)`; every rank builds the
same seeded model, keeps its own stage, and returns that stage's parameters after training.
"""

from __future__ import annotations

import functools
import time

import torch
import torch.distributed as dist
from torch.nn import functional as F

from .._typed import wrap_public
from ..distributed import rank_device, require_torch
from ..models import mlp
from . import worker_args
from .footprint import measured_bytes, tensor_bytes, train_measured, warm_up_once
from .schedules import SCHEDULES, stage_backward, stage_forward
from .splitting import split_stages
from .workload import Workload


def _my_stage(rank: int, world: int, widths, dtype, seed, device):
    """This rank's stage of the seeded MLP, and the shape of every stage's output per example."""
    stages = split_stages(mlp(widths, seed, dtype), world)
    h, shapes = torch.zeros(1, widths[0], dtype=dtype), []
    with torch.no_grad():
        for stage in stages:
            h = stage(h)
            shapes.append(tuple(h.shape[1:]))
    return stages[rank].to(device), shapes


class _Clock:
    """When device work started and ended: CUDA events on a GPU (in stream order), else the host."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:  # a common origin: the host's clock at an event on the (idle) stream
            torch.cuda.synchronize(device)
            self.origin = torch.cuda.Event(enable_timing=True)
            self.origin.record()
        self.host = time.perf_counter()

    def mark(self):
        """A point in the work queued so far (an event on a GPU, the host's clock elsewhere)."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, mark) -> float:
        """The host-clock time of `mark`; on a GPU, call it once the stream is synchronised."""
        return self.host + self.origin.elapsed_time(mark) / 1e3 if self.cuda else mark


def _incoming(action, rank, world, Xs, shapes, dtype, device):
    """(buffer, peer) that `action` receives its input into, or None if it receives nothing."""
    kind, i = action
    if kind == "F" and rank > 0:  # the previous stage's activation
        return torch.empty(len(Xs[i]), *shapes[rank - 1], dtype=dtype, device=device), rank - 1
    if kind == "B" and rank < world - 1:  # the next stage's gradient
        return torch.empty(len(Xs[i]), *shapes[rank], dtype=dtype, device=device), rank + 1
    return None


def _post(send, recv) -> tuple[list, object]:
    """Post one action's send and the next action's receive as one group: (send works, recv).

    NCCL runs the point-to-point operations of a rank in the order they are posted, and a send
    larger than its buffer waits for the matching receive. In 1F1B, stage s sends an activation
    while stage s+1 sends a gradient back: posted one after the other, each send would wait for a
    receive the other stage has not posted yet. Posted together (`batch_isend_irecv`, an NCCL
    group), they cannot block each other. gloo runs the same calls.
    """
    ops = [] if send is None else [dist.P2POp(dist.isend, send[0], send[1])]
    ops += [] if recv is None else [dist.P2POp(dist.irecv, recv[0], recv[1])]
    works = dist.batch_isend_irecv(ops) if ops else []
    if recv is None:
        return works, None
    return works[:-1], works[-1]


def _pipelined_step(stage, schedule, Xs, ys, shapes, rank, world, device, dtype) -> tuple:
    """Run this rank's actions with send/recv; return the timed events and the summed loss.

    Every receive is posted early (with the send before it) and waited for before the action's
    work is timed: on a GPU, `wait()` makes the compute stream wait for the data, and the
    action's CUDA events, recorded after it in the same stream, time the work alone.
    """
    clock, saved, sends, marks = _Clock(device), {}, [], []
    loss_sum = torch.zeros((), dtype=dtype, device=device)
    batch = sum(len(x) for x in Xs)
    inputs = [_incoming(a, rank, world, Xs, shapes, dtype, device) for a in schedule]
    works, recv = _post(None, inputs[0])
    for n, (kind, i) in enumerate(schedule):
        if recv is not None:
            recv.wait()  # a GPU's stream waits here, not the host
        start, send = clock.mark(), None
        if kind == "F":
            h = Xs[i].to(device) if rank == 0 else inputs[n][0]
            received, out = stage_forward(stage, h, device, first=rank == 0)
            if rank == world - 1:
                out = F.cross_entropy(out, ys[i].to(device), reduction="sum") / batch
                loss_sum += out.detach()
            else:
                send = (out.detach(), rank + 1)
            saved[i] = (received, out)
        else:
            grad = None if rank == world - 1 else inputs[n][0]
            grad_in = stage_backward(*saved.pop(i), grad)
            send = None if rank == 0 else (grad_in, rank - 1)
        marks.append((kind, i, start, clock.mark()))
        following = inputs[n + 1] if n + 1 < len(schedule) else None
        works, recv = _post(send, following)
        sends += [(w, send[0]) for w in works]  # keep each tensor alive until it is sent
    for work, _ in sends:
        work.wait()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    events = [(rank, k, i, clock.seconds(a), clock.seconds(b)) for k, i, a, b in marks]
    return events, loss_sum.item()


def pipeline_worker(
    rank: int, world: int, work: Workload, runs: list[tuple[str, int]]
) -> list[dict]:
    """For each (schedule, micro-batches) in `runs`: train work's SGD steps, pipelined by hand.

    Returns per run: this stage's parameters, the losses (last rank), the events of the last
    step, the bytes this rank held (measured where an allocator counts them; `held_by` says from
    what), those of the tensors it keeps (`kept`), its peak, and the median step time
    (`train_measured`). The first run of a process is preceded by a throwaway one of two steps,
    so that the runtime's lasting buffers are not counted as a stage's.
    """
    worker_args.pipeline(rank, world, work, runs)
    device = rank_device()
    X, y = work.data()
    job = (rank, world, work.widths, work.dtype, work.seed, device)
    first, m = runs[0]
    warm_up_once("pipeline", lambda: _one_run(job, first, m, X, y, 2, work.lr))
    return [_one_run(job, name, m, X, y, work.steps, work.lr) for name, m in runs]


def _one_run(job, name, m, X, y, steps, lr) -> dict:
    """Build this rank's stage afresh and train it with one schedule; see pipeline_worker."""
    rank, world, widths, dtype, seed, device = job
    schedule = SCHEDULES[name](world, m)[rank]
    Xs, ys = X.tensor_split(m), y.tensor_split(m)
    baseline = measured_bytes(device)
    stage, shapes = _my_stage(rank, world, widths, dtype, seed, device)

    def step():
        out = _pipelined_step(stage, schedule, Xs, ys, shapes, rank, world, device, dtype)
        with torch.no_grad():
            for p in stage.parameters():
                p -= lr * p.grad
                p.grad.zero_()
        return out

    run = train_measured(step, steps, device, stage, baseline, measure=measured_bytes)
    return {
        "params": [p.detach().cpu().clone() for p in stage.parameters()],
        "losses": [loss for _, loss in run["outputs"]] if rank == world - 1 else [],
        "events": run["outputs"][-1][0],
        **{key: run[key] for key in ("held", "held_by", "kept", "peak", "seconds")},
    }


def torch_pipeline_worker(
    rank: int, world: int, work: Workload, schedule: str = "1f1b", num_microbatches: int = 4
) -> dict:
    """The same training with torch.distributed.pipelining's PipelineStage and schedules; as
    pipeline_worker returns, and `buffers`, the bytes of the stage's receive buffers."""
    worker_args.torch_pipeline(rank, world, work, schedule, num_microbatches)
    require_torch(2, 6, "torch.distributed.pipelining (stages that infer their shapes)")
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    device = rank_device()
    X, y = work.data()
    X, y = X.to(device), y.to(device)
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]

    def run(steps: int, baseline) -> tuple:
        """Build this rank's stage and its schedule, train `steps` steps, measured."""
        stage_module = split_stages(mlp(list(work.widths), work.seed, work.dtype), world)[rank]
        stage_module = stage_module.to(device)
        stage = PipelineStage(stage_module, rank, world, device)
        # each micro-batch's mean loss; the schedule divides the gradients by num_microbatches
        sched = kind(stage, n_microbatches=num_microbatches, loss_fn=F.cross_entropy)
        step = functools.partial(_torch_pipeline_step, sched, stage_module, X, y, rank, world,
                                 num_microbatches, work.lr)  # fmt: skip
        measured = train_measured(
            step, steps, device, stage_module, baseline, measure=measured_bytes
        )
        return stage_module, {**measured, "buffers": _receive_buffer_bytes(stage)}

    warm_up_once("torch-pipeline", lambda: run(2, None))  # see pipeline_worker
    stage_module, result = run(work.steps, measured_bytes(device))
    keys = ("held", "held_by", "kept", "buffers", "peak", "seconds")
    return {
        "params": [p.detach().cpu().clone() for p in stage_module.parameters()],
        "losses": result["outputs"] if rank == world - 1 else [],
        **{key: result[key] for key in keys},
    }


def _receive_buffer_bytes(stage) -> int:
    """Bytes of the receive buffers a PipelineStage keeps from step to step (one per
    micro-batch: activations on later stages, their gradients on earlier ones), counted."""
    infos = [*getattr(stage, "args_recv_info", {}).values()]
    infos += [*getattr(stage, "grad_recv_info", {}).values()]
    flat = [r for info in infos for r in (info if isinstance(info, (tuple, list)) else [info])]
    return tensor_bytes([getattr(r, "buffer", None) for r in flat])


def _torch_pipeline_step(sched, stage_module, X, y, rank, world, num_microbatches, lr):
    """One step of torch_pipeline_worker: the schedule's forward and backward, then SGD; the
    mean loss of the micro-batches on the last rank, else None."""
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


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
