"""Ulysses-style context parallelism: attention by heads after an all-to-all, proven equal to
full attention and to one device's training in float64 on 2 and 4 gloo ranks."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

# the ring's job and its one-device run: 16 tokens, 4 heads, 2 layers, float64
from test_context_parallel import WORK, one_device  # noqa: F401 - one_device is a fixture
from torch.nn import functional as F

from d2l_gpu.parallel import context_parallel as cp
from d2l_gpu.parallel import ulysses
from d2l_gpu.workers import run_workers

F64 = torch.float64


def attention_case(rank, world):
    """Largest difference from full causal attention, forward and q/k/v gradients, on this rank."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 4, 16, 8, dtype=F64, generator=g, requires_grad=True) for _ in range(3)
    )
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    weights = torch.randn(full.shape, dtype=F64, generator=g)
    (full * weights).sum().backward()
    parts = [cp.shard_sequence(t.detach(), rank, world, "contiguous", dim=2) for t in (q, k, v)]
    parts = [p.requires_grad_() for p in parts]
    mine = ulysses.ulysses_attention(*parts)
    (mine * cp.shard_sequence(weights, rank, world, "contiguous", dim=2)).sum().backward()
    diffs = [
        (mine - cp.shard_sequence(full.detach(), rank, world, "contiguous", dim=2)).abs().max()
    ]
    for part, whole in zip(parts, (q, k, v), strict=True):
        want = cp.shard_sequence(whole.grad, rank, world, "contiguous", dim=2)
        diffs.append((part.grad - want).abs().max())
    return max(d.item() for d in diffs)


def ulysses_ranks(rank, world):
    out = {"attention": attention_case(rank, world)}
    out["train"] = ulysses.ulysses_worker(rank, world, WORK)
    with mock.patch.object(ulysses, "_trade", lambda x, world, traffic, key: x):
        out["no exchange"] = attention_case(rank, world)  # negative control: nothing traded
    try:
        ulysses.ulysses_attention(*(torch.zeros(1, 3, 4, 2),) * 3)
    except ValueError as e:
        out["error"] = str(e)
    return out


@pytest.fixture(scope="module")
def runs():
    return {w: run_workers(ulysses_ranks, w, backend="gloo", timeout=240) for w in (2, 4)}


@pytest.mark.parametrize("world", [2, 4])
def test_ulysses_attention_equals_full_attention_forward_and_backward(runs, world):
    assert all(r["attention"] < 1e-12 for r in runs[world])


@pytest.mark.parametrize("world", [2, 4])
def test_ulysses_training_equals_one_device(runs, one_device, world):  # noqa: F811 - fixture
    losses, params = one_device
    for r in runs[world]:
        run = r["train"]
        assert max(abs(a - b) for a, b in zip(run["losses"], losses, strict=True)) < 1e-10
        diffs = [(a - b).abs().max().item() for a, b in zip(run["params"], params, strict=True)]
        assert max(diffs) < 1e-10


@pytest.mark.parametrize("world", [2, 4])
def test_without_the_exchange_attention_is_wrong(runs, world):  # negative control
    assert all(r["no exchange"] > 1e-2 for r in runs[world])


@pytest.mark.parametrize("world", [2, 4])
def test_each_all_to_all_sends_the_share_that_leaves_the_rank(runs, world):
    """Per block and pass, q, k, v and the output each send (world - 1) / world of this rank's
    part [batch, heads, T / world, head_dim]; forward, then the same again in backward."""
    part = WORK.batch_size * WORK.d_model * (WORK.seq_len // world) * 8  # bytes, float64
    sent = part * (world - 1) // world * WORK.num_layers
    for r in runs[world]:
        traffic = r["train"]["traffic"]
        assert {traffic[key] for key in ("q", "k", "v", "out")} == {sent}
        assert {traffic[f"{key}_backward"] for key in ("q", "k", "v", "out")} == {sent}


def test_heads_that_do_not_divide_over_the_ranks_are_refused(runs):
    assert "3 heads do not divide over 2 ranks" in runs[2][0]["error"]
