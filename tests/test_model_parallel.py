"""Lesson 10: splitting a model by layers (stages, pipelines) and by channels (tensor parallel),
each proven equal to one device in float64 over several SGD steps; schedules and bubbles."""

import pytest
import torch
from conftest import newer_torch
from torch import nn
from torch.nn import functional as F

from d2l_gpu import models
from d2l_gpu.data import toy
from d2l_gpu.distributed import torch_version
from d2l_gpu.parallel import footprint, splitting, workload
from d2l_gpu.parallel import schedules as mp
from d2l_gpu.parallel.pipeline import pipeline_worker, torch_pipeline_worker
from d2l_gpu.parallel.tensor_parallel import tensor_parallel_worker, torch_tensor_parallel_worker
from d2l_gpu.parallel.workload import Workload
from d2l_gpu.workers import run_workers

F64 = torch.float64
WIDTHS = [12, 32, 24, 16, 5]  # an MLP with 7 units: Linear, ReLU, ... , Linear
STEPS, LR, BATCH = 4, 0.5, 12


def max_diff(xs, ys) -> float:
    xs, ys = list(xs), list(ys)
    assert len(xs) == len(ys)
    return max((a.detach() - b.detach()).abs().max().item() for a, b in zip(xs, ys, strict=True))


@pytest.fixture(scope="module")
def reference():
    """One device, the whole batch, plain SGD: the parameters after each step, and the losses."""
    net = models.mlp(WIDTHS, seed=0, dtype=F64)
    X, y = toy.toy_data(BATCH, WIDTHS[0], WIDTHS[-1], seed=0, dtype=F64)
    losses = workload.train_one_device(net, X, y, STEPS, LR)
    return [p.detach().clone() for p in net.parameters()], losses


def sgd(stages, lr):
    with torch.no_grad():
        for stage in stages:
            for p in stage.parameters():
                p -= lr * p.grad
                p.grad = None


# --- splitting: arithmetic and cuts ----------------------------------------------------------


def test_balanced_cuts_minimise_the_largest_stage():
    assert splitting.balanced_cuts([1, 1, 1, 1, 10, 1], 3) == [0, 4, 5, 6]
    assert splitting.balanced_cuts([1] * 6, 3) == [0, 2, 4, 6]
    assert splitting.balanced_cuts([5], 1) == [0, 1]
    with pytest.raises(ValueError, match="cannot cut 3 units into 4 stages"):
        splitting.balanced_cuts([1, 1, 1], 4)


def test_split_stages_keeps_every_unit_once_and_copies():
    net = models.mlp(WIDTHS, dtype=F64)
    stages = splitting.split_stages(net, 3)
    assert sorted(len(s) for s in stages) == [2, 2, 3]  # 7 units, as even as it gets
    X = torch.randn(4, WIDTHS[0], dtype=F64)
    h = X
    for s in stages:
        h = s(h)
    assert torch.equal(h, net(X))
    assert stages[0][0].weight is not net[0].weight  # a copy: training a stage leaves net alone


def test_split_costs_follow_the_formulas():
    net = models.mlp([8, 16, 8], dtype=torch.float32)  # Linear(8,16), ReLU, Linear(16,8)
    X = torch.zeros(10, 8)
    P = 8 * 16 + 16 + 16 * 8 + 8
    costs = splitting.split_costs(net, X, k=2, bytes_per_number=4)
    assert costs["data"]["params"] == P and costs["data"]["bytes_sent"] == 2 * 0.5 * P * 4
    assert costs["channels"]["params"] == P / 2
    # one Megatron pair: an all-reduce of its output forward; its input is X, so none backward
    assert costs["channels"]["bytes_sent"] == 2 * 0.5 * 8 * 10 * 4
    # the largest stage's parameters; a stage sends at most its output and its input's gradient
    assert costs["layers"]["params"] in (8 * 16 + 16, 16 * 8 + 8)
    assert costs["layers"]["bytes_sent"] == 16 * 10 * 4
    assert splitting.split_costs(net, X, 1)["data"]["bytes_sent"] == 0


def test_lenet_sequential_is_lesson_5s_lenet():
    from d2l_gpu.models import lenet, lenet_params

    X = torch.rand(3, 1, 28, 28, dtype=F64)
    net = models.lenet_sequential(seed=1).to(F64)
    ref = lenet(X, [p.to(F64) for p in lenet_params(1, 0.1)])
    assert torch.allclose(net(X), ref, atol=1e-12)


# --- model parallelism and pipelines in one process ------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_naive_model_parallel_equals_one_device(reference, k):
    X, y = toy.toy_data(BATCH, WIDTHS[0], WIDTHS[-1], seed=0, dtype=F64)
    net = models.mlp(WIDTHS, seed=0, dtype=F64)
    devices = mp.stage_devices(k)
    stages = mp.place_stages(splitting.split_stages(net, k), devices)
    losses = []
    for _ in range(STEPS):
        losses.append(mp.model_parallel_step(stages, devices, X, y))
        sgd(stages, LR)
    params = [p.cpu() for s in stages for p in s.parameters()]
    assert max_diff(params, reference[0]) < 1e-12
    assert max(abs(a - b) for a, b in zip(losses, reference[1], strict=True)) < 1e-12


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 1), (3, 4), (3, 5), (4, 12)])
def test_pipeline_schedule_equals_one_device(reference, name, p, m):
    """Uneven micro-batches (12 examples in 5) included: the losses are weighted by size."""
    X, y = toy.toy_data(BATCH, WIDTHS[0], WIDTHS[-1], seed=0, dtype=F64)
    devices = mp.stage_devices(p)
    stages = mp.place_stages(splitting.split_stages(models.mlp(WIDTHS, 0, F64), p), devices)
    schedule = mp.SCHEDULES[name](p, m)
    for step in range(STEPS):
        loss = mp.run_schedule(stages, devices, schedule, X, y)
        assert abs(loss - reference[1][step]) < 1e-12
        sgd(stages, LR)
    assert max_diff([q for s in stages for q in s.parameters()], reference[0]) < 1e-12


def test_schedules_run_every_action_once_in_a_valid_order():
    for p, m in [(1, 1), (2, 3), (4, 8), (5, 2)]:
        for name, make in mp.SCHEDULES.items():
            schedule = make(p, m)
            for acts in schedule:
                assert sorted(acts) == sorted(
                    [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
                )
                for i in range(m):
                    assert acts.index(("F", i)) < acts.index(("B", i)), name
            mp.simulate_schedule(schedule)  # raises if the stages wait for each other forever


def test_deadlocking_schedule_is_refused():
    bad = [[("F", 0), ("F", 1), ("B", 1), ("B", 0)], [("B", 0), ("F", 0), ("F", 1), ("B", 1)]]
    with pytest.raises(RuntimeError, match="deadlocks"):
        mp.simulate_schedule(bad)


@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (4, 1), (4, 3), (4, 8), (8, 32)])
def test_simulated_bubble_is_the_formula(p, m):
    formula = mp.bubble_fraction(p, m)
    assert formula == pytest.approx((p - 1) / (m + p - 1))
    for make in mp.SCHEDULES.values():
        for tf, tb in [(1.0, 1.0), (1.0, 2.0), (0.3, 0.5)]:
            events = mp.simulate_schedule(make(p, m), tf, tb)
            assert len(events) == 2 * p * m
            assert mp.idle_fraction(events) == pytest.approx(formula)


def test_1f1b_keeps_fewer_micro_batches_than_gpipe():
    p, m = 4, 8
    assert mp.max_in_flight(mp.gpipe_schedule(p, m)) == [m] * p
    assert mp.max_in_flight(mp.one_f_one_b_schedule(p, m)) == [p - s for s in range(p)]
    assert mp.max_in_flight(mp.one_f_one_b_schedule(4, 2)) == [2, 2, 2, 1]


def test_place_stages_wants_one_device_per_stage():
    with pytest.raises(ValueError, match="2 stages but 1 devices"):
        mp.place_stages([nn.Linear(2, 2), nn.Linear(2, 2)], [torch.device("cpu")])


# --- real processes: pipelines and tensor parallelism ----------------------------------------


def pipelines(rank, world, work, runs):
    """The hand-made pipeline's runs, then torch.distributed.pipelining, in one process group."""
    return pipeline_worker(rank, world, work, runs), torch_pipeline_worker(
        rank, world, work, "1f1b", 4
    )


@newer_torch(2, 6, "torch.distributed.pipelining")
def test_pipeline_processes_equal_one_device(reference):
    runs = [("gpipe", 1), ("gpipe", 4), ("1f1b", 3)]
    work = Workload(widths=WIDTHS, steps=STEPS, batch_size=BATCH, lr=LR, dtype=F64)
    out = run_workers(pipelines, 2, work, runs, backend="gloo", timeout=180)
    for j, (name, m) in enumerate(runs):
        params = [p for rank, _ in out for p in rank[j]["params"]]
        assert max_diff(params, reference[0]) < 1e-12, (name, m)
        losses = out[-1][0][j]["losses"]
        assert max(abs(a - b) for a, b in zip(losses, reference[1], strict=True)) < 1e-12
        for rank, _ in out:  # every stage ran 2m actions; it holds its stage's parameters
            assert len(rank[j]["events"]) == 2 * m
            assert rank[j]["peak"] > rank[j]["held"] > 0
    params = [p for _, theirs in out for p in theirs["params"]]  # torch.distributed.pipelining
    assert max_diff(params, reference[0]) < 1e-12
    # its stages keep a receive buffer per micro-batch: activations of the cut (BATCH x 24
    # numbers in all) on stage 1, their gradients on stage 0
    assert [theirs["buffers"] for _, theirs in out] == [BATCH * WIDTHS[2] * 8] * 2
    losses = out[-1][1]["losses"]
    assert max(abs(a - b) for a, b in zip(losses, reference[1], strict=True)) < 1e-12


TP_WIDTHS = (12, 32, 16, 32, 16, 5)  # two (Linear, ReLU, Linear) pairs, then ReLU, Linear


def tensor_parallels(rank, world):
    """The Megatron MLP and the channel-split LeNet by hand, then DTensor, in one group."""
    work = Workload(widths=TP_WIDTHS, steps=STEPS, batch_size=BATCH, lr=LR, dtype=F64)
    lenet = Workload(widths=None, steps=3, batch_size=8, lr=0.1, dtype=F64)
    return (
        tensor_parallel_worker(rank, world, work, "mlp"),
        tensor_parallel_worker(rank, world, lenet, "lenet"),
        torch_tensor_parallel_worker(rank, world, work),
    )


@pytest.fixture(scope="module")
def tp_runs():
    return run_workers(tensor_parallels, 2, backend="gloo", timeout=180)


def test_tensor_parallel_mlp_equals_one_device(tp_runs):
    net = models.mlp(list(TP_WIDTHS), seed=0, dtype=F64)
    X, y = toy.toy_data(BATCH, TP_WIDTHS[0], TP_WIDTHS[-1], seed=0, dtype=F64)
    losses = workload.train_one_device(net, X, y, STEPS, LR)
    for rank, _, theirs in tp_runs:
        assert max_diff(rank["params"], net.parameters()) < 1e-12
        assert max(abs(a - b) for a, b in zip(rank["losses"], losses, strict=True)) < 1e-12
        # forward: one all-reduce per pair; backward: one for the second pair's input only
        assert rank["calls"] == {"all_reduce": 3}
        assert max_diff(theirs["params"], net.parameters()) < 1e-12  # parallelize_module
        assert theirs["kinds"].count("DTensor") == 8  # 4 split layers, weight and bias each
        assert theirs["calls"] == {"all_reduce": 3}
    P = sum(p.numel() for p in net.parameters()) * 8
    assert tp_runs[0][0]["kept"] < 2 * P * 0.75  # params and grads: the pairs are halved


# --- held bytes measured from the C heap ------------------------------------------------------

MEDIUM = Workload(widths=(64, 1024, 256, 1024, 256, 10), steps=2, batch_size=64, lr=1e-3, dtype=F64)
_KEPT: list = []  # where the leaky workers below hide what they keep: no model holds it


def leaky_model_parallel(rank, world, work, leak):
    """A pipeline (GPipe, 4 micro-batches) and the Megatron MLP by hand and with DTensor; with
    `leak`, the output of every layer with weights is kept after its step (a logging bug)."""
    if leak:

        def keep(module, args, output):
            if getattr(module, "weight", None) is not None:
                _KEPT.append(output.detach())

        nn.modules.module.register_module_forward_hook(keep)
    runs = [pipeline_worker(rank, world, work, [("gpipe", 4)])[0]]
    runs.append(tensor_parallel_worker(rank, world, work, "mlp"))
    if not torch_version() < (2, 6):
        runs.append(torch_tensor_parallel_worker(rank, world, work))
        runs.append(torch_pipeline_worker(rank, world, work, "1f1b", 4))
    return runs


@newer_torch(2, 13, "held bytes read from the heap (gloo with one worker thread)")
@pytest.mark.skipif(footprint.heap_bytes() is None, reason="this C library counts no heap bytes")
@pytest.mark.parametrize("leak", [False, True])
def test_held_bytes_measured_from_the_heap_match_what_the_model_keeps(leak):
    """Within 2% of the parameters and gradients a rank keeps, and for torch.distributed's
    pipeline its stage's receive buffers (measured here: 0.1-0.8% above, the model's Python
    objects and each tensor's bookkeeping, with one busy core or none); a rank that keeps its
    layers' outputs after each step (8-24% more) fails, which counting the model's tensors
    cannot see."""
    for rank in run_workers(leaky_model_parallel, 2, MEDIUM, leak, backend="gloo"):
        for run in rank:
            assert run["held_by"] == "the C heap (mallinfo2)"
            ratio = run["held"] / (run["kept"] + run.get("buffers", 0))
            assert (abs(ratio - 1) < 0.02) != leak, ratio


def test_channel_parallel_lenet_equals_one_device(tp_runs):
    net = models.lenet_sequential(seed=0).to(F64)
    X, y = toy.toy_images(8, seed=0, dtype=F64)
    losses = workload.train_one_device(net, X, y, 3, 0.1)
    for _, rank, _ in tp_runs:
        assert max_diff(rank["params"], net.parameters()) < 1e-12
        assert max(abs(a - b) for a, b in zip(rank["losses"], losses, strict=True)) < 1e-12
        # 2 convs; conv 2's input; the Megatron pair of linear layers forward and backward
        assert rank["calls"] == {"all_gather": 2, "all_reduce": 3}


def _sent_per_rank(run: dict, k: int) -> float:
    """Bytes one rank sends in ring collectives: (k-1)/k of a gather, twice that of a reduce."""
    full = run["bytes"]
    return (k - 1) / k * (full.get("all_gather", 0) + 2 * full.get("all_reduce", 0))


def test_split_costs_counts_what_the_split_models_send(tp_runs):
    """Issue 23: the channels column counted every unit's output (41 MB for LeNet against the
    12.5 MB its channel-parallel version sent). Now it counts the lessons' own implementations:
    equal to the bytes the collectives of one step carried (CollectiveCounter), for the Megatron
    MLP and for LeNet. The negative control is the old count, every unit's output each way."""
    mlp_run, lenet_run, _ = tp_runs[0]
    cases = [
        (
            models.mlp(list(TP_WIDTHS), dtype=F64),
            torch.zeros(BATCH, TP_WIDTHS[0], dtype=F64),
            mlp_run,
        ),
        (models.lenet_sequential().to(F64), torch.zeros(8, 1, 28, 28, dtype=F64), lenet_run),
    ]
    for net, X, run in cases:
        counted = splitting.split_costs(net, X, k=2, bytes_per_number=8)["channels"]["bytes_sent"]
        assert counted == pytest.approx(_sent_per_rank(run, 2), rel=1e-12)
        every_output = sum(r["out"] for r in splitting.layer_table(net, X[:1])) * len(X) * 8
        assert every_output != pytest.approx(_sent_per_rank(run, 2), rel=0.1)


def test_a_transformer_block_counts_megatrons_four_all_reduces():
    """Two all-reduces forward (attention, MLP) and two backward per block, of B x T x d each."""
    from d2l_gpu.gpt import TransformerBlock

    net = nn.Sequential(TransformerBlock(16, 2), TransformerBlock(16, 2))
    X = torch.zeros(3, 5, 16)
    sent = splitting.split_costs(net, X, k=2)["channels"]["bytes_sent"]
    assert sent == pytest.approx(2 * 4 * (2 * 1 / 2) * 3 * 5 * 16 * 4)  # blocks x 4 x ring x BTd


def test_tensor_parallel_refuses_an_uneven_split():
    from d2l_gpu.parallel.tensor_parallel import ColumnParallelLinear

    with pytest.raises(ValueError, match="do not split evenly over 3 ranks"):
        ColumnParallelLinear(nn.Linear(4, 5), rank=0, world=3)


def test_one_step_loss_matches_functional_cross_entropy():
    """run_schedule's weighted micro-batch losses add up to the batch's mean loss."""
    X, y = toy.toy_data(10, WIDTHS[0], WIDTHS[-1], seed=3, dtype=F64)
    net = models.mlp(WIDTHS, seed=3, dtype=F64)
    expected = F.cross_entropy(net(X), y).item()
    stages = splitting.split_stages(net, 2)
    devices = mp.stage_devices(2)
    loss = mp.run_schedule(mp.place_stages(stages, devices), devices, mp.gpipe_schedule(2, 3), X, y)
    assert loss == pytest.approx(expected, abs=1e-12)


def overlapped(events) -> bool:
    """Whether rank 0's forward of micro-batch 1 starts before rank 1's forward of 0 ends."""
    start = {(r, k, i): (a, b) for r, k, i, a, b in events}
    return start[0, "F", 1][0] < start[1, "F", 0][1]


@pytest.mark.solo  # two stages overlap only where two cores are free
def test_the_process_pipeline_overlaps_its_stages():
    """Stage 0 runs micro-batch 1 while stage 1 runs micro-batch 0: measured, not scheduled."""
    wide = [64, 768, 768, 768, 10]  # tens of milliseconds per forward, far above scheduling noise
    work = Workload(widths=wide, steps=1, batch_size=512, lr=LR, dtype=F64)
    out = run_workers(pipeline_worker, 2, work, [("gpipe", 4)], backend="gloo", timeout=180)
    events = [e for rank in out for e in rank[0]["events"]]
    assert overlapped(events), sorted(events, key=lambda e: e[3])
    # the check can fail: the same events with stage 0 waiting for stage 1 before each forward
    serial = [(r, k, i, a + (9.0 if r == 0 and i else 0), b + (9.0 if r == 0 and i else 0))
              for r, k, i, a, b in events]  # fmt: skip
    assert not overlapped(serial)


def test_cuts_fall_after_units_that_cost_nothing():
    """A cut by FLOPs goes after the ReLU and the pool that follow a convolution (they cost no
    FLOPs), where the activation to send is the smallest, not right after the convolution."""
    costs = [5.0, 0.0, 0.0, 5.0, 0.0]  # conv, ReLU, pool, conv, ReLU
    assert splitting.balanced_cuts(costs, 2) == [0, 3, 5]
    assert splitting.balanced_cuts([1.0] * 7, 3) == [0, 2, 4, 7]  # no zero costs: unchanged
    assert splitting.balanced_cuts([0.0, 0.0, 1.0], 3) == [0, 1, 2, 3]  # every group keeps one
