"""Context parallelism: the layouts (shard/unshard round trips, zig-zag balances the causal
work) and ring attention on 2 and 4 gloo ranks in float64: its output and gradients equal full
causal attention, training the small transformer with it equals one device (losses and
parameters after 3 SGD steps, to 1e-10), the chunk pairs each rank computes are the predicted
work (balanced only under zig-zag), and the bytes the dispatcher sees are the predicted ones.
Negative controls: a mask from local positions, and partial results merged without their
log-sum-exp weights."""

from unittest import mock

import pytest
import torch
import torch.distributed as dist
from torch.nn import functional as F

from d2l_gpu.parallel import context_parallel as cp
from d2l_gpu.parallel import cp_worker, workload
from d2l_gpu.parallel.context_parallel import (
    LAYOUTS,
    causal_work,
    shard_sequence,
    unshard_sequence,
)
from d2l_gpu.workers import run_workers


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_shard_roundtrip(layout, world):
    x = torch.arange(2 * 16).reshape(2, 16)
    parts = [shard_sequence(x, r, world, layout, dim=1) for r in range(world)]
    assert torch.equal(unshard_sequence(parts, world, layout, dim=1), x)


def test_zigzag_positions():
    x = torch.arange(8)
    assert shard_sequence(x, 0, 2, "zigzag").tolist() == [0, 1, 6, 7]
    assert shard_sequence(x, 1, 2, "zigzag").tolist() == [2, 3, 4, 5]


def test_work_balance():
    for world in (2, 4):
        zig = causal_work(world, "zigzag")
        assert len(set(zig)) == 1
        flat = causal_work(world, "contiguous")
        assert flat == sorted(flat) and flat[-1] > flat[0]
        assert sum(flat) == sum(zig)


def test_bad_input():
    with pytest.raises(ValueError, match="layout"):
        causal_work(2, "spiral")
    with pytest.raises(ValueError, match="divisible"):
        shard_sequence(torch.zeros(6), 0, 2)
    with pytest.raises(ValueError, match="rank"):
        shard_sequence(torch.zeros(8), 2, 2)


# --- ring attention (float64, gloo) ------------------------------------------------------------

WORK = workload.TransformerWorkload(seq_len=16, steps=3)  # vocab 32, d_model 16, 4 heads, 2 layers


def attention_case(rank, world, layout):
    """Ring attention on this rank's part against full causal attention: output, dq, dk, dv."""
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(2, 2, 16, 4, generator=g, dtype=torch.float64) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref.backward(dout)
    parts = [
        shard_sequence(t.detach(), rank, world, layout, dim=2).requires_grad_() for t in (q, k, v)
    ]
    out = cp.ring_attention(*parts, layout=layout)
    out.backward(shard_sequence(dout, rank, world, layout, dim=2))
    diffs = []
    mine_all = [out.detach()] + [p.grad for p in parts]
    for mine, whole in zip(mine_all, [ref, q.grad, k.grad, v.grad], strict=True):
        everyone = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(everyone, mine.contiguous())
        diffs.append((unshard_sequence(everyone, world, layout, dim=2) - whole).abs().max().item())
    return max(diffs)


def mask_from_local_positions(rank, src, world, layout):
    """The bug of a negative control: every block masked as if its keys sat where mine do."""
    return PAIRS(rank, rank, world, layout)


def merge_without_rescaling(out, lse, out_b, lse_b):
    """The bug of a negative control: partial results averaged, not weighted by their sums."""
    return (out + out_b) / 2, torch.logaddexp(lse, lse_b)


PAIRS = cp._pairs
MISTAKES = {"local positions": ("_pairs", mask_from_local_positions),
            "no log-sum-exp": ("merge", merge_without_rescaling)}  # fmt: skip


def ring_ranks(rank, world):
    """Everything one group of `world` ranks checks, in one start of the processes."""
    out = {}
    for layout in LAYOUTS:
        out["attention", layout] = attention_case(rank, world, layout)
        out["train", layout] = cp_worker.context_parallel_worker(rank, world, WORK, layout)
    for mistake, (name, bug) in MISTAKES.items():
        with mock.patch.object(cp, name, bug):  # in this rank's process only
            out["attention", mistake] = attention_case(rank, world, "zigzag")
    errors = []
    part = torch.zeros(1, 1, 4, 2, dtype=torch.float64)
    for call in (lambda: cp.ring_attention(part, part[..., :1], part),
                 lambda: cp.ring_attention(*(torch.zeros(1, 1, 3, 2),) * 3)):  # fmt: skip
        try:
            call()
        except ValueError as e:
            errors.append(str(e))
    out["errors"] = errors
    return out


@pytest.fixture(scope="module")
def ring_runs():
    return {world: run_workers(ring_ranks, world, backend="gloo", timeout=240) for world in (2, 4)}


@pytest.fixture(scope="module")
def one_device():
    net = WORK.model()
    X, y = WORK.data()
    losses = workload.train_transformer(net, X, y, WORK.steps, WORK.lr)
    return losses, [p.detach() for p in net.parameters()]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_ring_attention_equals_full_attention_forward_and_backward(ring_runs, world, layout):
    assert all(r["attention", layout] < 1e-12 for r in ring_runs[world])


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_context_parallel_training_equals_one_device(ring_runs, one_device, world, layout):
    losses, params = one_device
    for r in ring_runs[world]:
        run = r["train", layout]
        assert max(abs(a - b) for a, b in zip(run["losses"], losses, strict=True)) < 1e-10
        assert (
            max((a - b).abs().max().item() for a, b in zip(run["params"], params, strict=True))
            < 1e-10
        )


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("mistake", MISTAKES)
def test_negative_controls_are_caught(ring_runs, world, mistake):
    assert all(r["attention", mistake] > 1e-2 for r in ring_runs[world])


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_chunk_pairs_computed_are_the_predicted_work(ring_runs, world, layout):
    pairs = [r["train", layout]["pairs"] for r in ring_runs[world]]
    assert pairs == causal_work(world, layout)
    assert (len(set(pairs)) == 1) == (layout == "zigzag")  # zig-zag balances, contiguous not


@pytest.mark.parametrize("world", [2, 4])
def test_bytes_sent_are_the_predicted_bytes(ring_runs, world):
    run = ring_runs[world][0]["train", "zigzag"]
    assert run["bytes"]["send"] == run["bytes"]["recv"] == run["predicted"]["send"]
    assert run["bytes"]["all_reduce"] == run["predicted"]["all_reduce"]
    assert run["calls"]["send"] == WORK.num_layers * (2 * (world - 1) + 1)  # fwd, bwd, home


def test_ring_attention_refuses_bad_parts(ring_runs):
    errors = ring_runs[2][0]["errors"]
    assert len(errors) == 2, errors
    assert "q, k and v of one shape" in errors[0] and "3 tokens" in errors[1]
