"""Context parallelism layouts: shard/unshard round-trips and zig-zag balances the causal work.

Negative control: contiguous layout is unbalanced (rank world-1 does the most). Ring attention
itself is not written yet.
"""

import pytest
import torch

from d2l_gpu.parallel.context_parallel import causal_work, shard_sequence, unshard_sequence


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
