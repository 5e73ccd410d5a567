"""d2l_gpu.parallel.server_steps (lesson 12): real training steps through parameter servers. Each
step ends with every rank holding the sum of all ranks' gradients; every schedule is timed for every
k; rank 0's trace shows the backward pass and then the synchronisation."""

from __future__ import annotations

import pytest

from d2l_gpu.parallel.server_steps import SYNC_EVENT, server_step_worker
from d2l_gpu.profiling import gradient_op, overlap_us, trace_events
from d2l_gpu.workers import run_workers


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("server-steps")
    return run_workers(server_step_worker, 3, 2, 32, 16, str(folder), 2, timeout=120)[0]


def test_every_step_sums_every_ranks_gradients(result):
    assert result["rel_diff"] < 1e-6


def test_every_schedule_timed_for_every_k(result):
    expected = {("compute", 1)} | {(s, k) for s in ("compute", "one server", "k servers")
                                   for k in (2, 3)}  # fmt: skip
    assert set(result["seconds"]) == expected
    assert all(0 < t < 10 for t in result["seconds"].values())


def test_the_trace_shows_backward_then_synchronisation(result):
    for name in ("one server", "k servers"):
        events = trace_events(result["traces"][name]["path"])
        assert sum(e["name"] == SYNC_EVENT for e in events) == 1
        assert overlap_us(events, gradient_op, SYNC_EVENT) == 0  # one after the other
        assert result["traces"][name]["sync_ms"] > 0


def test_bad_arguments_refused_before_any_message(tmp_path):
    with pytest.raises(ValueError, match="width"):
        server_step_worker(0, 1, 2, 0, 4)
    with pytest.raises(FileNotFoundError, match="create it first"):
        server_step_worker(0, 1, 2, 8, 4, str(tmp_path / "missing"))
