"""The alpha-beta model of lesson 12: the fit, the formulas, a real measurement it predicts, and
the two-machine measurement over network namespaces (Linux and root only)."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import netns_link
import pytest
import torch

from d2l_gpu.parallel import costmodel
from d2l_gpu.parallel.costmodel import AlphaBeta
from d2l_gpu.workers import run_workers

MB = 1e6
SIZES = [4 * 4**i for i in range(13)]  # 4 B to 64 MiB, a factor of 4 apart
HELD_OUT = 2**24  # 16 MiB: bandwidth decides its time, so a wrong beta shows
# On the 2-core development machine while ~7 other jobs ran (load average 14-20), 8 runs
# predicted the held-out size within 1.00-1.41x (median 1.1x). A beta 10x too high misses by
# about 4x or more.
FACTOR = 3.0


def test_fit_recovers_alpha_and_beta_from_exact_times():
    sizes = [4 * 4**i for i in range(12)]
    link = AlphaBeta(alpha=30e-6, beta=2.5e9)
    fitted = costmodel.fit_alpha_beta(sizes, [link.time(n) for n in sizes])
    assert math.isclose(fitted.alpha, link.alpha, rel_tol=1e-9)
    assert math.isclose(fitted.beta, link.beta, rel_tol=1e-9)


def test_fit_without_visible_latency_is_bandwidth_only():
    sizes = [1e3, 1e4, 1e5]
    fitted = costmodel.fit_alpha_beta(
        sizes, [n / 1e9 * (1 + 0.1 * (-1) ** i) for i, n in enumerate(sizes)]
    )
    assert fitted.alpha >= 0 and 0.8e9 < fitted.beta < 1.2e9


def test_fit_rejects_bad_input():
    with pytest.raises(ValueError, match="need 2 or more"):
        costmodel.fit_alpha_beta([1.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        costmodel.fit_alpha_beta([1.0, 2.0], [1.0, 0.0])


@pytest.mark.parametrize(
    ("sizes", "times", "said"),
    [
        ([1e3, 1e4, 1e5], [1e-4, float("nan"), 1e-3], "sizes and times must be finite numbers"),
        ([1e3, float("inf")], [1e-4, 1e-3], "sizes and times must be finite numbers"),
        ([4096, 4096, 4096], [1e-4, 1.1e-4, 0.9e-4], "at least 2 different sizes"),
        ([-1.0, 1e3], [1e-4, 1e-3], "every size 0 or more"),
    ],
)
def test_fit_refuses_what_it_cannot_fit_with_a_sentence(sizes, times, said):
    """Issue 46: NaN reached torch.linalg.lstsq, whose internal assert asked the student to
    report our bug to PyTorch; one distinct size returned a fit of two unknowns from one."""
    with pytest.raises(ValueError, match=said):
        costmodel.fit_alpha_beta(sizes, times)


def test_leaving_out_one_size_moves_the_fit_little():
    """Lesson 12 checks this on its own measurement; here on times with one lucky outlier (a 4 KiB
    message at 0.3x its time). Leaving out any one size moves the robust fit by 3%. The
    negative control: the fit weighted by the measured times only (rounds=1), which the lesson
    says one fast message can drag, moves by 80%."""
    sizes = [4 * 4**i for i in range(12)]
    link = AlphaBeta(alpha=90e-6, beta=2e9)
    wobble = [1.0, 1.08, 0.95, 1.05, 0.97, 0.3, 1.02, 0.93, 1.06, 0.96, 1.04, 0.98]
    times = [link.time(n) * w for n, w in zip(sizes, wobble, strict=True)]

    def spread(rounds: int) -> float:
        full = costmodel.fit_alpha_beta(sizes, times, rounds)
        moved = []
        for i in range(len(sizes)):
            part = costmodel.fit_alpha_beta(
                sizes[:i] + sizes[i + 1 :], times[:i] + times[i + 1 :], rounds
            )
            moved += [abs(part.alpha / full.alpha - 1), abs(part.beta / full.beta - 1)]
        return max(moved)

    assert spread(20) < 0.25
    assert spread(1) > 0.5


def test_a_flat_ring_waits_for_its_slower_link():
    """Every step of a flat ring moves nbytes/k over all its links at once."""
    slow_across, slow_inside = AlphaBeta(50e-6, 1e8), AlphaBeta(300e-6, 2e9)
    fast_across = AlphaBeta(50e-6, 1e12)
    n = 2**20
    assert costmodel.flat_ring_time(slow_inside, slow_across, n, 4) == costmodel.ring_time(
        slow_across, n, 4
    )
    assert costmodel.flat_ring_time(slow_inside, fast_across, n, 4) == costmodel.ring_time(
        slow_inside, n, 4
    )  # a fast link across: the loopback decides, not the across link's latency
    assert costmodel.ring_time(fast_across, n, 4) < 0.3 * costmodel.ring_time(slow_inside, n, 4)
    assert costmodel.flat_ring_time(slow_inside, slow_across, n, 1) == 0.0


def test_the_two_level_hierarchy_moves_a_gth_inside_and_shares_the_cards_across():
    inside, between = AlphaBeta(5e-6, 100e9), AlphaBeta(20e-6, 12.5e9)
    N, m, g = 100 * MB, 2, 4
    one_card = costmodel.two_level_time(inside, between, N, m, g)
    assert math.isclose(
        one_card, 2 * 3 * inside.time(N / 4) + 2 * (between.alpha + N / 4 / 2 / (between.beta / 4))
    )
    card_each = costmodel.two_level_time(inside, between, N, m, g, nics=g)
    assert math.isclose(
        card_each, 2 * 3 * inside.time(N / 4) + costmodel.ring_time(between, N / 4, m)
    )
    leader = costmodel.hierarchical_time(inside, between, N, m, g)
    # one card: the same bytes across as the leader's ring, a quarter of them inside
    assert one_card < leader and math.isclose(
        one_card - 6 * inside.time(N / 4), leader - 6 * inside.time(N)
    )
    assert card_each < 0.4 * one_card  # four rings at once across, on four cards


def test_the_books_worked_example():
    """Four GPUs behind a 16 GB/s PCIe switch, 160 MB of gradients (the book's numbers)."""
    pcie = AlphaBeta(alpha=0.0, beta=16e9)
    N = 160 * MB
    assert math.isclose(costmodel.ps_time(pcie, N, 4), 60e-3)  # everything to GPU 0 and back
    assert math.isclose(costmodel.ps_time(pcie, N, 5), 80e-3)  # to the CPU: a 5th party
    assert math.isclose(costmodel.ps_time(pcie, N, 4, num_servers=4), 15e-3)  # 4 key ranges
    nvlink = AlphaBeta(alpha=0.0, beta=3 * 18e9)  # 8 V100s, rings over NVLink
    assert math.isclose(costmodel.ring_time(nvlink, N, 8), 2 * 7 / 8 * N / nvlink.beta)
    assert 5e-3 < costmodel.ring_time(nvlink, N, 8) < 6e-3


def test_hierarchy_and_pipeline_formulas():
    fast, slow = AlphaBeta(1e-6, 100e9), AlphaBeta(10e-6, 1e9)
    N = 100 * MB
    flat = costmodel.ring_time(slow, N, 4)
    tiered = costmodel.hierarchical_time(fast, slow, N, machines=2, local_size=2)
    assert math.isclose(tiered, 2 * fast.time(N) + 2 * slow.time(N / 2))
    assert 1.4 < flat / tiered < 1.5  # 1.5 N / beta against N / beta plus the fast part
    assert costmodel.ring_time(slow, N, 1) == 0.0
    assert costmodel.pipeline_time([1, 1, 1], [0.5, 0.5, 0.5]) == 3.5  # the last send remains
    assert costmodel.pipeline_time([1, 1], [3, 3]) == 7  # the link is the bottleneck
    assert costmodel.pipeline_time([2], [0]) == 2


def _pingpong() -> dict:
    """Real message times between two processes, medians of 7 rounds."""
    times, other = run_workers(costmodel.pingpong_worker, 2, SIZES, 7, timeout=240)
    assert times == other  # both ranks report the slowest rank's medians
    assert all(t > 0 for t in times.values())
    assert times[SIZES[-1]] > times[SIZES[0]]  # 64 MiB take longer than 4 bytes
    return times


def _fit(times: dict) -> AlphaBeta:
    """The alpha-beta fit of every measured size but HELD_OUT."""
    kept = [n for n in SIZES if n != HELD_OUT]
    return costmodel.fit_alpha_beta(kept, [times[n] for n in kept])


def _miss(times: dict) -> tuple[float, str]:
    """How far (a factor >= 1) the fit of every size but HELD_OUT misses HELD_OUT's time."""
    link = _fit(times)
    predicted, measured = link.time(HELD_OUT), times[HELD_OUT]
    said = f"{link}: predicted {predicted:.2e} s, measured {measured:.2e} s"
    return max(predicted / measured, measured / predicted), said


STATISTICS = """
import itertools, statistics, time
import torch.distributed as dist
from d2l_gpu.parallel.costmodel import time_ops
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
naps = itertools.cycle([0.001, 0.2, 0.05])  # any 3 rounds in a row: one of each
ops = {"nap": lambda: time.sleep(next(naps))}
for statistic in (min, statistics.median, max):
    print(statistic.__name__, time_ops(ops, rounds=3, statistic=statistic)["nap"])
dist.destroy_process_group()
"""


def test_time_ops_sums_the_rounds_up_with_the_statistic_asked_for():
    """Lesson 12 keeps each size's cheapest round (statistic=min) where the median can mislead."""
    out = subprocess.run(
        [sys.executable, "-c", STATISTICS], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    got = {name: float(t) for name, t in (line.split() for line in out.stdout.splitlines())}
    assert 0.001 <= got["min"] < 0.05 <= got["median"] < 0.2 <= got["max"], got  # 49 ms of slack


def test_model_predicts_a_held_out_size():
    """A timing on a shared machine: a second measurement is taken only if the first misses
    (seen once, 2026-11-27, in a full unit run on the idle 2-core machine: the fitted bandwidth
    fell to 0.6 GB/s against about 2 GB/s, a 3.2x miss); a wrong model misses both."""
    ratio, said = _miss(_pingpong())
    if ratio >= FACTOR:
        ratio, again = _miss(_pingpong())
        said = f"twice: {said}; {again}"
    assert ratio < FACTOR, said


def test_a_wrong_bandwidth_misses_the_held_out_size():
    """The negative control: the same check fails a model whose bandwidth is 10x too high."""
    times = _pingpong()
    link = _fit(times)
    wrong = AlphaBeta(link.alpha, 10 * link.beta)
    predicted, measured = wrong.time(HELD_OUT), times[HELD_OUT]
    assert max(predicted / measured, measured / predicted) >= FACTOR


@pytest.mark.cluster  # root and network namespaces: `make test-cluster`
def test_two_machines_over_a_slow_link(tmp_path):
    ok, why = netns_link.available()
    if not ok:
        pytest.skip(f"network namespaces unavailable: {why}")
    out = tmp_path / "netns.json"
    cmd = [sys.executable, netns_link.__file__, "--rate-mbit", "100", "--size-kb", "512"]
    cmd += ["--rounds", "3", "--out", str(out)]
    subprocess.run(cmd, check=True, timeout=300, capture_output=True)
    result = json.loads(out.read_text())
    between = AlphaBeta(*result["between_model"])
    rate = result["rate_mbit"] * 1e6 / 8
    assert 0.7 * rate < between.beta < 1.3 * rate, f"{between}, tc allows {rate / 1e6} MB/s"
    inside = AlphaBeta(*result["inside_model"])
    assert inside.beta > 5 * between.beta  # loopback is much faster than the shaped veth
    measured = result["measured"]
    assert measured["hierarchical"] < measured["ring"]  # the slow link carries less
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "d2l11-" not in left  # every namespace made was removed


def test_a_stop_signal_is_noted_and_acted_on_between_steps(monkeypatch):
    """A handler that raised could land inside Popen.wait while that held its lock; the clean-up's
    own wait then waited forever (CI, 2026-11-29). The handler only notes the signal now."""
    monkeypatch.setattr(netns_link, "STOPPED", [])
    netns_link._check_stop()  # nothing received: goes on
    netns_link._stop(signal.SIGTERM, None)  # returns: raises nothing where the signal lands
    with pytest.raises(SystemExit, match="netns_link: stopped by SIGTERM; cleaned up"):
        netns_link._check_stop()


@pytest.mark.cluster  # root and network namespaces: `make test-cluster`
@pytest.mark.parametrize("after", [0.0, 1.0])  # seconds after the folder: ranks starting, running
def test_two_machines_are_removed_when_the_script_is_terminated(tmp_path, after):
    """Issue 27: SIGTERM left both namespaces and the temporary folder behind."""
    ok, why = netns_link.available()
    if not ok:
        pytest.skip(f"network namespaces unavailable: {why}")
    cmd = [sys.executable, netns_link.__file__, "--rate-mbit", "100", "--size-kb", "512"]
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("d2l11-netns-*")):  # the machines exist and the ranks start
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    time.sleep(after)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert "stopped by SIGTERM; cleaned up" in err
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"d2l11-{proc.pid}-" not in left
    assert not list(tmp_path.glob("d2l11-netns-*"))
    assert not subprocess.run(["pgrep", "-f", "netns_link.py --worker"], capture_output=True).stdout


RING_SIZES = [4 * 16**i for i in range(6)]  # 4 B to 4 MiB: the ring steps that fit the link
RING_N = 2**24  # the held-out all-reduce: 16 MiB, 6 steps of 4 MiB on 4 ranks
# 12 runs on the idle 2-core machine (2026-11-27, 6 of them with OMP_NUM_THREADS=1): the model
# missed by 1.01-1.29x; the wrong model below by 2.79-6.28x. (On 3 ranks, 3 processes on 2
# cores, the same runs gave 1.04-2.43x: the lesson prints that row but this test leaves it out.)
RING_FACTOR = 2.0


def _ring_miss(wrong: bool = False) -> tuple[float, str]:
    """How far the ring model of 4 ranks, fed ring steps of 4 ranks, misses RING_N."""
    cases = [("ring step", 4, n) for n in RING_SIZES] + [("ring", 4, RING_N)]
    timed = run_workers(costmodel.collective_worker, 4, cases, 5, timeout=240)[0]
    loaded = costmodel.fit_alpha_beta(RING_SIZES, [timed[("ring step", 4, n)] for n in RING_SIZES])
    step = RING_N if wrong else RING_N / 4  # the wrong model sends the whole buffer per step
    predicted, measured = 6 * loaded.time(step), timed[("ring", 4, RING_N)]
    said = f"{loaded}: predicted {predicted:.2e} s, measured {measured:.2e} s"
    return max(predicted / measured, measured / predicted), said


@pytest.mark.solo  # 4 ranks timed on 2 cores: another test beside them skews alpha and beta
def test_ring_steps_predict_a_held_out_ring_all_reduce():
    """The collective, not only a ping-pong: the hand-written ring of 16 MiB on 4 ranks, predicted
    from ring steps of at most 4 MiB timed with every rank sending at once. Measured again once if
    the first run misses (a timing on a shared machine); a wrong model misses both."""
    ratio, said = _ring_miss()
    if ratio >= RING_FACTOR:
        ratio, again = _ring_miss()
        said = f"twice: {said}; {again}"
    assert ratio < RING_FACTOR, said


@pytest.mark.solo  # beside another test (make test, 2026-11-30) the wrong model missed by 1.93x
def test_a_ring_that_sends_the_whole_buffer_per_step_misses():
    """The negative control: the same check fails a model whose every step sends all N bytes."""
    ratio, said = _ring_miss(wrong=True)
    assert ratio >= RING_FACTOR, said


@pytest.mark.parametrize("kind", ["cuda", "mps", "xpu"])
def test_sync_device_waits_on_every_backend(monkeypatch, kind):
    """Lesson 12's timings wait for the device's queue on every backend, not only CUDA's (they
    were unsynchronised on MPS and XPU: the clock stopped before the work was done)."""
    calls = []
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False, raising=False)
    module = getattr(torch, kind)
    wait = (lambda: calls.append(kind)) if kind == "mps" else (lambda d=None: calls.append(kind))
    monkeypatch.setattr(module, "synchronize", wait)
    costmodel.sync_device(torch.device(kind, 0) if kind != "mps" else torch.device("mps"))
    assert calls == [kind]
    costmodel.sync_device(torch.device("cpu"))
    assert calls == [kind]  # the CPU has no queue to wait for
