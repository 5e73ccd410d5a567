"""d2l_gpu.profiling (lesson 8): traces written and read back, overlaps measured on known events,
and a DDP step whose buckets are launched during the backward pass only when there are several."""

from __future__ import annotations

import json

import pytest
import torch

from d2l_gpu import profiling
from d2l_gpu.workers import run_workers


def event(name, start, dur, thread="1/1"):
    return {"name": name, "cat": "cpu_op", "thread": thread, "start": start, "dur": dur}


def test_spans_merge_and_overlap_counts_only_time_both_run():
    events = [event("a", 0, 10), event("a", 5, 10), event("a", 30, 5), event("b", 12, 20)]
    assert profiling.spans(events, "a") == [(0, 15), (30, 35)]
    assert profiling.overlap_us(events, "a", "b") == 3 + 2  # 12-15 and 30-32
    assert profiling.overlap_us(events, "a", lambda e: e["name"] == "c") == 0  # nothing matches
    disjoint = [event("a", 0, 10), event("b", 10, 5)]
    assert profiling.overlap_us(disjoint, "a", "b") == 0  # touching is not overlapping


def test_profile_step_writes_a_trace_with_the_labelled_regions(tmp_path):
    net = torch.nn.Linear(8, 2)

    def step():
        with torch.profiler.record_function("forward"):
            loss = net(torch.ones(4, 8)).sum()
        with torch.profiler.record_function("backward"):
            loss.backward()

    events = profiling.profile_step(step, tmp_path / "step.json", warmup=1)
    names = {e["name"] for e in events}
    assert {"forward", "backward", "aten::addmm"} <= names
    assert events == profiling.trace_events(tmp_path / "step.json")
    assert [p.name for p in tmp_path.iterdir()] == ["step.json"]  # no temporary file left
    f, b = (profiling.spans(events, n)[0] for n in ("forward", "backward"))
    assert f[1] <= b[0]  # the forward region ends before the backward one starts


def test_bad_input_is_one_sentence(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a folder"):
        profiling.profile_step(lambda: None, tmp_path)
    with pytest.raises(FileNotFoundError, match="create it first"):
        profiling.profile_step(lambda: None, tmp_path / "no" / "t.json")
    with pytest.raises(TypeError, match="step"):
        profiling.profile_step(3, tmp_path / "t.json")
    with pytest.raises(FileNotFoundError, match="profile_step first"):
        profiling.trace_events(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        profiling.trace_events(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"events": []}))
    with pytest.raises(ValueError, match="no traceEvents"):
        profiling.trace_events(tmp_path / "other.json")
    with pytest.raises(ValueError, match="no event matches"):
        profiling.plot_trace([event("a", 0, 1)], {"b": "b"})


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ddp-traces")
    return {
        cap: run_workers(profiling.ddp_trace_worker, 2, cap, str(folder / f"{cap}.json"))[0]
        for cap in (0.05, None)
    }


def test_small_buckets_are_launched_while_gradients_remain(ddp_runs):
    """LeNet in buckets of 0.05 MiB: 3 all-reduces, the first 2 launched during the backward."""
    r = ddp_runs[0.05]
    assert r["all_reduces"] == 3 and r["launched_in_backward"] == 2
    assert r["comm_us"] > 0


def test_one_bucket_cannot_overlap(ddp_runs):
    """The negative control: DDP's default 25 MiB holds all of LeNet, launched after the last
    gradient, so no all-reduce runs while a gradient is computed."""
    r = ddp_runs[None]
    assert r["all_reduces"] == 1 and r["launched_in_backward"] == 0
    assert r["overlap_us"] == 0.0


def test_ddp_scaling_worker_times_both_steps():
    """Lesson 8's scaling table: a DDP step and the same step alone, on every rank, in seconds."""
    from d2l_gpu.profiling import ddp_scaling_worker
    from d2l_gpu.workers import run_workers

    out = run_workers(ddp_scaling_worker, 2, 8, 2, timeout=120)
    assert [set(r) for r in out] == [{"alone", "ddp"}] * 2
    assert all(0 < t < 10 for r in out for t in r.values())
    with pytest.raises(ValueError, match="batch_per_rank"):
        ddp_scaling_worker(0, 1, 0)
