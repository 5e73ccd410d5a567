"""Expert parallelism (mixture of experts) from scratch, in float64 on 2 and 4 gloo ranks: the
experts spread over the ranks with all-to-all dispatch and combine give the one-device layer's
output, input gradients, router and expert gradients (1e-12) and SGD steps (1e-10) when no token
is dropped; a wrong token order or missing gates is caught; drops, the load-balancing loss and
the bytes each all-to-all sends match hand computations; bad arguments are refused."""

import math
from dataclasses import replace

import pytest
import torch

from d2l_gpu.parallel.expert_parallel import (
    ExpertParallelMoE,
    MoE,
    all_to_all_bytes,
    gather_experts,
    sent_matrix,
)
from d2l_gpu.parallel.moe_worker import MoEWorkload, expert_parallel_worker, train_moe_one_device
from d2l_gpu.workers import run_workers

F64 = torch.float64
# capacity_factor = num_experts / top_k: an expert's capacity is every token, so nothing drops
WORK = {
    2: MoEWorkload(d_model=8, ffn=16, num_experts=4, top_k=1, capacity_factor=4.0, tokens=32),
    4: MoEWorkload(
        d_model=8,
        ffn=16,
        num_experts=4,
        top_k=2,
        capacity_factor=2.0,
        tokens=32,
        seed=1,
        aux_weight=0.1,
    ),
}
SMALL = replace(WORK[2], capacity_factor=0.5, steps=1)  # capacity 2 of each rank's 16 tokens


class WrongOrder(ExpertParallelMoE):
    """A plausible bug: results put back in sorted token order, not where each token was."""

    def combine(self, back, tokens, gates, n):
        return super().combine(back, tokens.sort().values, gates, n)


class NoGates(ExpertParallelMoE):
    """A plausible bug: the experts' results added without their gate weights."""

    def combine(self, back, tokens, gates, n):
        return super().combine(back, tokens, torch.ones_like(gates), n)


def group(rank, world):
    """Everything one group checks, so that few groups start: training, bugs, drops."""
    work = WORK[world]
    out = {"run": expert_parallel_worker(rank, world, work)}
    moe, (x, _) = work.model(), work.data()
    with torch.no_grad():
        want = moe(x).chunk(world, dim=1)[rank]
        for name, kind in [("right", ExpertParallelMoE), ("order", WrongOrder), ("gates", NoGates)]:
            out[name] = (kind(moe, rank, world)(x.chunk(world, dim=1)[rank]) - want).abs().max()
    if world == 2:
        out["small"] = expert_parallel_worker(rank, world, SMALL)
    return out


@pytest.fixture(scope="module")
def runs():
    return {world: run_workers(group, world, backend="gloo", timeout=180) for world in (2, 4)}


def max_diff(a: dict, b: dict) -> float:
    assert list(a) == list(b)
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize("world", [2, 4])
def test_forward_and_gradients_equal_one_device(runs, world):
    ref = train_moe_one_device(WORK[world])["first"]
    ranks = [r["run"]["first"] for r in runs[world]]
    assert ref["dropped"] == 0 and [r["dropped"] for r in ranks] == [0] * world
    output = torch.cat([r["output"] for r in ranks], dim=1)
    assert (output - ref["output"]).abs().max() < 1e-12
    input_grad = torch.cat([r["input_grad"] for r in ranks], dim=1)
    assert (input_grad - ref["input_grad"]).abs().max() < 1e-12
    for r in ranks:  # the router's summed gradient, and every expert's from its owner
        assert max_diff(r["grads"], ref["grads"]) < 1e-12
    assert abs(sum(r["aux"] for r in ranks) - ref["aux"]) < 1e-12  # shares add up


@pytest.mark.parametrize("world", [2, 4])
def test_sgd_steps_equal_one_device(runs, world):
    ref = train_moe_one_device(WORK[world])
    losses = [sum(step) for step in zip(*(r["run"]["losses"] for r in runs[world]), strict=True)]
    assert len(losses) == WORK[world].steps
    assert max(abs(a - b) for a, b in zip(losses, ref["losses"], strict=True)) < 1e-10
    for r in runs[world]:
        assert max_diff(r["run"]["params"], ref["params"]) < 1e-10


@pytest.mark.parametrize("world", [2, 4])
def test_wrong_order_or_missing_gates_is_caught(runs, world):
    for r in runs[world]:
        assert r["right"] < 1e-12
        assert r["order"] > 1e-3 and r["gates"] > 1e-3


def test_all_to_all_bytes_measured_equal_predicted(runs):
    for world, ranks in runs.items():
        for rank, r in enumerate(ranks):
            traffic, predicted = r["run"]["first"]["traffic"], r["run"]["predicted"]
            assert {k: traffic[k] for k in predicted} == predicted
            assert predicted["dispatch"] > 0 and predicted["combine"] > 0, (world, rank)
            assert traffic["counts"] == (world - 1) * (4 // world) * 8  # int64 per expert
            # CollectiveCounter, independently: the rows each all-to-all brings in (own ones too)
            first, sent, row = r["run"]["first"], r["run"]["sent"], 8 * 8
            received = 2 * (sent[:, rank].sum() + sent[rank].sum()).item() * row + 4 * 8
            assert first["calls"]["alltoall"] == 5  # counts; dispatch, combine and backwards
            assert first["bytes"]["alltoall"] == received
            assert first["calls"]["all_reduce"] == 2  # the aux loss's counts, the router


def test_all_to_all_bytes_by_hand():
    sent = torch.tensor([[3, 1], [2, 5]])  # rank 0 sends 1 row to rank 1, rank 1 sends 2
    out = all_to_all_bytes(sent, d_model=4, element_size=8)
    assert out["dispatch"] == [32, 64] and out["combine"] == [64, 32]
    assert out["dispatch_backward"] == out["combine"] and out["combine_backward"] == out["dispatch"]


def test_small_capacity_drops_the_same_tokens_on_ranks_and_per_slice(runs):
    moe, (x, _) = SMALL.model(), SMALL.data()
    for rank, r in enumerate(runs[2]):
        part = x.chunk(2, dim=1)[rank]
        with torch.no_grad():
            want = moe(part)  # one device on this rank's tokens: the same capacity
        assert moe.dropped > 0 and r["small"]["first"]["dropped"] == moe.dropped
        assert (r["small"]["first"]["output"] - want).abs().max() < 1e-12


def tiny_moe(top_k=1, capacity_factor=0.5):
    """2 experts on 2 features; the router's logits are the features themselves."""
    moe = MoE(
        d_model=2, ffn=4, num_experts=2, top_k=top_k, capacity_factor=capacity_factor, dtype=F64
    )
    with torch.no_grad():
        moe.router.weight.copy_(torch.eye(2, dtype=F64))
    x = torch.tensor([[1.0, 0], [2, 0], [3, 0], [0, 1]], dtype=F64)  # experts 0, 0, 0, 1
    return moe, x


def test_capacity_drops_by_token_index():
    moe, x = tiny_moe()
    assert moe.capacity(4) == 1  # ceil(0.5 * 4 tokens * 1 / 2 experts)
    y = moe(x)
    assert moe.dropped == 2  # tokens 1 and 2 come after token 0 at expert 0
    assert y[1].abs().max() == 0 and y[2].abs().max() == 0
    sig = 1 / (1 + math.exp(-1))  # softmax([1, 0])[0] = softmax([0, 1])[1]
    with torch.no_grad():
        assert (y[0] - sig * moe.experts[0](x[0])).abs().max() < 1e-15
        assert (y[3] - sig * moe.experts[1](x[3])).abs().max() < 1e-15


def test_top2_gates_are_renormalised():
    moe, x = tiny_moe(top_k=2, capacity_factor=1.0)  # capacity 4: nothing drops
    y = moe(x)
    p0 = 1 / (1 + math.exp(-1.0))
    with torch.no_grad():
        want = p0 * moe.experts[0](x[0]) + (1 - p0) * moe.experts[1](x[0])
    assert moe.dropped == 0 and (y[0] - want).abs().max() < 1e-15


def test_aux_loss_by_hand_and_its_gradient_reaches_the_router():
    moe, x = tiny_moe()
    moe(x)
    p0 = [1 / (1 + math.exp(-a)) for a in (1, 2, 3, -1)]  # each token's probability of expert 0
    P0 = sum(p0) / 4
    assert abs(moe.aux_loss.item() - 2 * (3 / 4 * P0 + 1 / 4 * (1 - P0))) < 1e-15
    moe.aux_loss.backward()
    assert moe.router.weight.grad.abs().max() > 1e-3


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda: ExpertParallelMoE(MoE(8, 16, 3), 0, 2), ValueError, "num_experts=3"),
        (
            lambda: expert_parallel_worker(0, 4, replace(WORK[2], num_experts=6)),
            ValueError,
            "num_experts=6",
        ),
        (lambda: expert_parallel_worker(0, 3, WORK[2]), ValueError, "num_experts=4"),
        (lambda: MoE(8, 16, 1, top_k=2), ValueError, "top_k=2"),
        (lambda: MoE(8, 16, 4, top_k=3), ValueError, "top_k"),
        (lambda: MoEWorkload(num_experts=1, top_k=2), ValueError, "top_k=2"),
        (lambda: MoE(8, 16, 4, capacity_factor=0), ValueError, "capacity_factor"),
        (lambda: MoEWorkload(capacity_factor=-1.0), ValueError, "capacity_factor"),
        (lambda: expert_parallel_worker(0, 2, "work"), TypeError, "MoEWorkload"),
        (lambda: expert_parallel_worker(0, 2, replace(WORK[2], tokens=33)), ValueError, "33"),
        (lambda: all_to_all_bytes(torch.ones(2, 3), 4, 8), ValueError, "square"),
        (lambda: ExpertParallelMoE(torch.nn.Linear(2, 2), 0, 2), TypeError, "MoE"),
        (lambda: ExpertParallelMoE(MoE(8, 16, 4), 2, 2), ValueError, "rank"),
        (lambda: sent_matrix(MoE(8, 16, 4), torch.ones(4, 8), 3), ValueError, "num_experts=4"),
        (lambda: gather_experts(ExpertParallelMoE(MoE(8, 16, 4), 0, 2)), RuntimeError, "group"),
    ],
)
def test_bad_input_is_refused_in_one_sentence(call, error, words):
    with pytest.raises(error, match=words):
        call()
