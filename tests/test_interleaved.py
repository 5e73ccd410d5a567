"""Interleaved 1F1B and the two zero-bubble schedules of torch.distributed.pipelining, each with
several stages per rank, proven equal to one device in float64 on real gloo ranks."""

from __future__ import annotations

import pytest
import torch
from conftest import newer_torch
from torch.nn import functional as F

from d2l_gpu import models
from d2l_gpu.data import toy
from d2l_gpu.parallel import worker_args
from d2l_gpu.parallel.interleaved import interleaved_pipeline_worker, stages_of_rank
from d2l_gpu.parallel.schedules import INTERLEAVED
from d2l_gpu.parallel.workload import Workload
from d2l_gpu.workers import run_workers

F64 = torch.float64
WIDTHS = [12, 32, 24, 16, 5]  # 7 units: 4 stages of 1-2 units on 2 ranks
STEPS, LR, BATCH = 4, 0.5, 12
WORK = Workload(widths=WIDTHS, steps=STEPS, batch_size=BATCH, lr=LR, dtype=F64)


def one_device(batch: int = BATCH) -> tuple[list[torch.Tensor], list[float]]:
    """Plain SGD on the first `batch` examples on one device: parameters and losses."""
    net = models.mlp(WIDTHS, seed=0, dtype=F64)
    X, y = toy.toy_data(BATCH, WIDTHS[0], WIDTHS[-1], seed=0, dtype=F64)
    losses = []
    for _ in range(STEPS):
        loss = F.cross_entropy(net(X[:batch]), y[:batch])
        loss.backward()
        losses.append(loss.item())
        with torch.no_grad():
            for p in net.parameters():
                p -= LR * p.grad
                p.grad.zero_()
    return [p.detach() for p in net.parameters()], losses


def every_schedule(rank, world, work):
    return [interleaved_pipeline_worker(rank, world, work, name, 2, 4) for name in INTERLEAVED]


def in_model_order(ranks: list[dict]) -> list[torch.Tensor]:
    by_stage = {i: ps for rank in ranks for i, ps in rank["params"].items()}
    return [p for i in sorted(by_stage) for p in by_stage[i]]


def max_diff(xs, ys) -> float:
    return max((a - b).abs().max().item() for a, b in zip(xs, ys, strict=True))


@newer_torch(2, 6, "the zero-bubble schedules of torch.distributed.pipelining")
def test_every_interleaved_schedule_equals_one_device():
    params, losses = one_device()
    out = run_workers(every_schedule, 2, WORK, backend="gloo", timeout=180)
    for j, name in enumerate(INTERLEAVED):
        runs = [rank[j] for rank in out]
        assert max_diff(in_model_order(runs), params) < 1e-12, name
        last = [r["losses"] for r in runs if r["losses"]]  # the rank holding the last stage
        assert len(last) == 1 and max_diff(torch.tensor(last[0]), torch.tensor(losses)) < 1e-12


def test_a_pipeline_that_lost_a_micro_batch_would_differ():  # negative control
    """Training on three of the four micro-batches moves the parameters by far more than the
    proof's tolerance."""
    assert max_diff(one_device(BATCH * 3 // 4)[0], one_device()[0]) > 1e-6


def test_the_layouts_give_every_stage_to_one_rank():
    for world in (1, 2, 3, 4):
        for layout, v in (("loop", 2), ("loop", 3), ("v", 2)):
            held = [i for r in range(world) for i in stages_of_rank(r, world, v, layout)]
            assert sorted(held) == list(range(world * v))
    assert stages_of_rank(0, 2, 2, "v") == [0, 3]  # rank 0 holds the first and the last


@pytest.mark.parametrize("args, words", [
    (("zbv-zero-bubble", 3, 4), "exactly 2 stages per rank, not 3"),
    (("interleaved-1f1b", 4, 4), "too few for 8 stages (4 per rank)"),
    (("interleaved-1f1b", 2, 5), "does not split into 5 equal micro-batches"),
    (("1f1b", 2, 4), "schedule"),
])  # fmt: skip
def test_bad_arguments_are_one_sentence(args, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        worker_args.interleaved(0, 2, WORK, *args)
