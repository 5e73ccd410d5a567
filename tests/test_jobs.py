"""d2l_gpu.jobs (launching jobs, killing a worker on an event) and one-write error lines."""

from __future__ import annotations

import io
import os
import select
import sys
import time
from pathlib import Path

import pytest

from d2l_gpu import jobs
from d2l_gpu.stopping import say_line

LINUX = Path("/proc/self/task").exists()

# A stand-in for torchrun's agent: two workers with LOCAL_RANK 0 and 1; it reports how each ended.
AGENT = """
import os, subprocess, sys
WORKER = '''
import os, sys, time
rank = os.environ["LOCAL_RANK"]
print(f"rank {rank} ready", flush=True)
if rank == "1":
    time.sleep(120)  # killed long before: the event comes first
'''
kids = [
    subprocess.Popen([sys.executable, "-c", WORKER], env={**os.environ, "LOCAL_RANK": str(r)})
    for r in range(2)
]
for r, kid in enumerate(kids):
    print(f"worker {r} exited with {kid.wait()}", flush=True)
"""


def test_launch_returns_the_output_and_refuses_a_failure():
    assert jobs.launch([sys.executable, "-c", "print('hello')"]).strip() == "hello"
    with pytest.raises(RuntimeError, match="exited with 3"):
        jobs.launch([sys.executable, "-c", "import sys; print('x'); sys.exit(3)"])
    out = jobs.launch([sys.executable, "-c", "import sys; sys.exit(3)"], check=False)
    assert out == ""


def test_a_hanging_job_is_killed_with_its_children_and_said_so(tmp_path):
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    with pytest.raises(TimeoutError, match="did not end within 3 s") as info:
        jobs.launch([sys.executable, "-c", script], timeout=3)
    child = int(str(info.value).strip().splitlines()[-1])
    if LINUX:  # the grandchild went with the group: gone, or a zombie waiting for init
        try:  # SIGKILL lands at once, but the process may still be ending: wait for its exit
            pidfd = os.pidfd_open(child)
        except ProcessLookupError:
            return
        try:
            assert select.select([pidfd], [], [], 30)[0], f"process {child} still runs"
        finally:
            os.close(pidfd)


def test_run_job_refuses_half_a_kill_and_a_bad_timeout():
    with pytest.raises(ValueError, match="kill_rank and when"):
        jobs.run_job(["true"], when=lambda out: True)
    with pytest.raises(ValueError, match="timeout must be a positive"):
        jobs.run_job(["true"], timeout=0)


@pytest.mark.skipif(not LINUX, reason="worker_pids reads /proc")
def test_the_kill_lands_on_the_event_and_the_others_go_on():
    job = jobs.run_job(
        [sys.executable, "-c", AGENT],
        kill_rank=1,
        when=lambda out: "rank 1 ready" in out,
        timeout=60,
    )
    assert job.killed and job.returncode == 0
    assert "worker 0 exited with 0" in job.output  # paused and continued, not killed
    assert "worker 1 exited with -9" in job.output


@pytest.mark.skipif(not LINUX, reason="worker_pids reads /proc")
def test_no_event_no_kill():
    """Negative control: an event that never comes kills nobody (rank 1 then runs to its end)."""
    agent = AGENT.replace("time.sleep(120)", "pass")
    job = jobs.run_job(
        [sys.executable, "-c", agent], kill_rank=1, when=lambda out: "never" in out, timeout=60
    )
    assert not job.killed and "worker 1 exited with 0" in job.output


def test_an_error_sentence_is_one_write(monkeypatch, tmp_path):
    """Ranks share one pipe: a sentence and its newline written apart can interleave (issue 20)."""
    writes = []
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(data) or len(data))
    with open(tmp_path / "err", "w") as stream:
        say_line("d2l_gpu.train: error (rank 1): 3 ranks but only 2 examples", stream)
    assert writes == [b"d2l_gpu.train: error (rank 1): 3 ranks but only 2 examples\n"]
    # the negative control: print() writes the text and the newline separately
    recorder = io.StringIO()
    calls = []
    recorder.write = lambda s: calls.append(s) or len(s)
    print("a sentence", file=recorder)
    assert calls == ["a sentence", "\n"]


LEAVES = "import time; time.sleep(120)"  # a machine that would run long, switched off instead
STAYS = "import time; print('checkpoint written', flush=True); time.sleep(0.5); print('done')"


def test_a_machine_is_switched_off_on_the_event_and_the_other_runs_to_its_end():
    """launch_nodes (lesson 7): the kill is decided by a line either machine prints."""
    stays, leaves = jobs.launch_nodes(
        [[sys.executable, "-c", STAYS], [sys.executable, "-c", LEAVES]],
        leaving=1,
        when=lambda out: "checkpoint written" in out,
        timeout=60,
    )
    assert leaves.killed and leaves.returncode != 0  # killed long before its two minutes
    assert not stays.killed and stays.returncode == 0 and "done" in stays.output


def test_launch_nodes_refuses_one_machine_and_a_machine_it_has_not():
    one = [[sys.executable, "-c", "pass"]]
    with pytest.raises(ValueError, match="cmds must hold at least 2 item"):
        jobs.launch_nodes(one, 0, lambda out: True)
    with pytest.raises(ValueError, match="leaving must be a whole number from 0 to 1, got 2"):
        jobs.launch_nodes(one * 2, 2, lambda out: True)


ORPHAN = (
    "import subprocess, sys\n"
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'],"
    " start_new_session=True)\n"  # leaves, holding the job's output pipe open
    "print('started', p.pid, flush=True)\n"
)


def test_a_job_that_leaves_a_process_holding_its_output_still_returns(monkeypatch):
    """The job ends, but a process it started in a session of its own (a rank orphaned by its
    agent) keeps the output pipe open: launch returns what it read, instead of waiting forever
    for the reading thread's lock when it closes the pipe."""
    monkeypatch.setattr(jobs, "LAST_OUTPUT_S", 1.0)
    tic = time.monotonic()
    out = jobs.launch([sys.executable, "-c", ORPHAN], timeout=60)
    took = time.monotonic() - tic
    os.kill(int(out.split()[1]), 9)  # the orphan, which nothing else would end
    assert out.startswith("started") and took < 20
