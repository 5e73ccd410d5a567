"""d2l_gpu.parallel.overlap (lesson 12): a real backward pass whose buckets' all-reduces start from
gradient hooks. Every schedule ends with the summed gradients; in the trace the hooks launch the
all-reduces of all buckets but the last while gradients remain to be computed, and (the negative
control) neither one bucket nor the schedule that sends after the backward launches or overlaps
any."""

from __future__ import annotations

import pytest

from d2l_gpu.parallel.overlap import backward_overlap_worker, layer_stack
from d2l_gpu.profiling import trace_events
from d2l_gpu.workers import run_workers

LAYERS, WIDTH, BATCH = 8, 64, 32


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Rank 0's results with buckets of 2 layers and with one bucket of all 8."""
    out = {}
    for per_bucket in (2, LAYERS):
        folder = tmp_path_factory.mktemp(f"overlap-{per_bucket}")
        args = (LAYERS, WIDTH, BATCH, per_bucket, str(folder), 2)
        out[per_bucket] = run_workers(backward_overlap_worker, 2, *args, timeout=120)[0]
    return out


def test_every_schedule_ends_with_the_summed_gradients(runs):
    for r in runs.values():
        assert set(r["rel_diff"]) == {"after backward", "buckets"}
        assert max(r["rel_diff"].values()) < 1e-6, r["rel_diff"]


def test_several_buckets_are_launched_while_gradients_remain(runs):
    traces = runs[2]["traces"]
    assert traces["buckets"]["all_reduces"] == traces["after backward"]["all_reduces"] == 4
    # launched by the hooks, in backward order: buckets 1-3 while layers remain, the last one
    # with the last gradient (when gloo's thread runs them depends on the machine's load)
    assert traces["buckets"]["launched_in_backward"] == 3
    assert traces["after backward"]["launched_in_backward"] == 0  # the negative control
    assert traces["after backward"]["overlap_ms"] == 0.0
    events = trace_events(traces["buckets"]["path"])  # the file Perfetto would open
    assert sum(e["name"] == "gloo:all_reduce" for e in events) == 4


def test_one_bucket_cannot_overlap(runs):
    """All 8 layers in one bucket: it is complete only with the last gradient."""
    traces = runs[LAYERS]["traces"]
    assert traces["buckets"]["all_reduces"] == 1 and traces["buckets"]["overlap_ms"] == 0.0
    assert traces["buckets"]["launched_in_backward"] == 0


def test_times_of_every_schedule(runs):
    seconds = runs[2]["seconds"]
    assert set(seconds) == {"backward alone", "all-reduces alone", "after backward", "buckets"}
    assert all(0 < t < 10 for t in seconds.values())


def test_layer_stack_holds_width_squared_numbers_per_layer():
    net = layer_stack(3, 16)
    assert [p.numel() for p in net.parameters()] == [256] * 3


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((0, 64, 8, 1, None, 1), ValueError, "layers"),
        ((4, 64, 8, 5, None, 1), ValueError, "per_bucket 5 is more than the 4 layers"),
        ((4, 64, 8, 2, "/no/such/folder", 1), FileNotFoundError, "create it first"),
        ((4, 64, 8, 2, 3, 1), TypeError, "folder must be a path"),
    ],
)
def test_bad_arguments_refused_before_any_message(args, error, message):
    with pytest.raises(error, match=message):
        backward_overlap_worker(0, 1, *args)
