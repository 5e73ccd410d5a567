"""d2l.tp_time_estimate: tensor parallelism's arithmetic against its all-reduces, per token."""

from __future__ import annotations

import pytest

import d2l_gpu as d2l


def test_the_counts_are_the_blocks_flops_and_the_rings_bytes():
    est = d2l.tp_time_estimate(1000, 4, 1e12, 1e9, bytes_per_number=2, mfu=1.0)
    assert est["compute_s"] == pytest.approx(72 * 1000**2 / 4 / 1e12)
    assert est["comm_s"] == pytest.approx(4 * 2 * 3 / 4 * 1000 * 2 / 1e9)
    assert est["comm_share"] == pytest.approx(est["comm_s"] / (est["comm_s"] + est["compute_s"]))


def test_one_rank_sends_nothing_and_a_slower_link_costs_more():
    assert d2l.tp_time_estimate(512, 1, 1e12, 1e9)["comm_s"] == 0
    fast, slow = (d2l.tp_time_estimate(8192, 8, 989e12, bw) for bw in (450e9, 50e9))
    assert slow["comm_s"] == pytest.approx(9 * fast["comm_s"]) and slow["comm_share"] > 0.5
    assert fast["comm_share"] < 0.25  # inside a machine the arithmetic dominates


@pytest.mark.parametrize("kwargs, words", [
    ({"mfu": 0}, "mfu is a fraction"),
    ({"mfu": 1.5}, "mfu is a fraction"),
    ({"link_bytes_per_s": 0}, "link_bytes_per_s must be a positive rate"),
    ({"flops_per_s": -1.0}, "flops_per_s must be a positive rate"),
])  # fmt: skip
def test_bad_rates_are_one_sentence(kwargs, words):
    args = {"d_model": 64, "tp": 2, "flops_per_s": 1e12, "link_bytes_per_s": 1e9} | kwargs
    with pytest.raises(ValueError, match=words):
        d2l.tp_time_estimate(**args)
