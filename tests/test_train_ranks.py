"""The training script on several processes of this machine: 2 ranks = 1 process, a killed rank
resumes to the uninterrupted result, two torchrun "machines", nothing listening beyond loopback,
and a clean exit (the group's threads are gone before the interpreter shuts down)."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import skip_strategies_this_torch_lacks
from train_launch import (
    ARGS,
    ARGS64,
    SCRIPT,
    TIMEOUT,
    launched,
    load,
    max_diff,
    run,
    run_with_a_kill,
    torchrun,
)

from d2l_gpu.distributed import torch_version


def listening(pids: set[int]) -> set[str]:
    """Local addresses on which the processes `pids` accept TCP connections (Linux `ss`)."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout
    found = set()
    for line in out.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            found.add(line.split()[3].rsplit(":", 1)[0])
    return found


def job_pids(root: int) -> set[int]:
    """`root` and its descendants (Linux /proc)."""
    pids, todo = set(), [root]
    while todo:
        pid = todo.pop()
        pids.add(pid)
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in (task / "children").read_text().split()]
    return pids


@pytest.fixture(scope="module")
def two_ranks(job_env, tmp_path_factory) -> tuple[dict, set[str]]:
    """Final parameters of two ranks under torchrun, and the addresses the job listened on."""
    cwd = tmp_path_factory.mktemp("two")
    cmd, env2 = torchrun(2, job_env, cwd)
    addresses: set[str] = set()
    watch = shutil.which("ss") is not None and Path("/proc").is_dir()
    with launched([*cmd, *SCRIPT, *ARGS64, "--save", "final.pt"], env2, cwd) as proc:
        deadline = time.monotonic() + TIMEOUT
        while watch and proc.poll() is None and time.monotonic() < deadline:
            addresses |= listening(job_pids(proc.pid))
            time.sleep(0.2)
        out, _ = proc.communicate(timeout=max(1, deadline - time.monotonic()))
    assert proc.returncode == 0, out
    assert "world size 2 (gloo, cpu, ddp)" in out and "global batch 32 = 2 x 16" in out, out
    return load(cwd / "final.pt"), addresses


@pytest.mark.slow
def test_two_ranks_equal_one_process(one_process, two_ranks):
    assert max_diff(one_process, two_ranks[0]) < 1e-12


@pytest.mark.slow
def test_one_machine_job_listens_on_loopback_only(two_ranks):
    addresses = two_ranks[1]
    if not shutil.which("ss"):
        pytest.skip("needs the `ss` tool (iproute2) to list listening sockets")
    assert addresses, "the job's store was never seen listening"
    assert addresses <= {"127.0.0.1", "[::1]"}, addresses


@pytest.mark.slow
def test_killed_rank_restarts_and_resumes(job_env, tmp_path, two_ranks):
    """SIGKILL rank 1 from outside after the epoch-1 checkpoint: torchrun restarts both ranks,
    which resume from epoch 1 and end with the uninterrupted job's weights."""

    def job(folder):
        cmd, env2 = torchrun(2, job_env, folder, "--max-restarts", "1")
        return [*cmd, *SCRIPT, *ARGS64, "--checkpoint", "ckpt.pt", "--save", "final.pt"], env2

    code, out, tmp_path = run_with_a_kill(job, tmp_path)
    assert code == 0, out
    assert "exitcode: -9" in out and "resumed from ckpt.pt: 1 of 2 epochs done" in out, out
    assert out.count("epoch 1/2:") == 1 and out.count("epoch 2/2:") == 1, out
    assert max_diff(load(tmp_path / "final.pt"), two_ranks[0]) < 1e-12
    ckpt = load(tmp_path / "ckpt.pt")
    assert ckpt["epoch"] == 2 and ckpt["world_size"] == 2 and len(ckpt["rng"]) == 2
    assert not list(tmp_path.glob(".ckpt.pt.*.tmp"))


@pytest.mark.slow
def test_two_machines_one_job(job_env, tmp_path, one_process):
    """Two torchrun agents (--nnodes 2, one worker each) meet through a shared rendezvous file."""
    cmd, env2 = torchrun(1, job_env, tmp_path, "--nnodes", "2", "--rdzv-id", "d2l-test")
    where = cmd.index("--rdzv-endpoint") + 1
    cmd[where] = str(tmp_path / "rdzv-shared")  # both agents: the same file
    cmd = [*cmd, *SCRIPT, *ARGS64, "--save", "final.pt"]
    with contextlib.ExitStack() as stack:
        agents = [stack.enter_context(launched(cmd, env2, tmp_path)) for _ in range(2)]
        outs = [agent.communicate(timeout=TIMEOUT)[0] for agent in agents]
    assert all(a.returncode == 0 for a in agents), outs
    assert "world size 2 (gloo, cpu, ddp)" in "".join(outs), outs
    assert max_diff(load(tmp_path / "final.pt"), one_process) < 1e-12


CHECK_THREADS = """
import os, sys
from d2l_gpu import train
from d2l_gpu.distributed import end_process
def native_threads():
    tasks = os.listdir("/proc/self/task")
    return sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in tasks)
before = native_threads()
status = train.main(sys.argv[1:])
print("status", status, "before", before, "after", native_threads(), flush=True)
end_process(status)  # as `python -m d2l_gpu.train` ends
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads threads from Linux /proc")
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "pipeline"])
def test_group_threads_are_joined_before_the_interpreter_exits(job_env, tmp_path, strategy):
    """The root of the rare SIGABRT at exit: gloo threads still alive at interpreter shutdown.

    A gloo thread that releases a finished collective's tensors during shutdown needs the GIL,
    is ended by CPython, and the C++ runtime aborts ("terminate called without an active
    exception"). Leaving the group must join those threads while Python is still whole. Before
    PyTorch 2.8 joining them could deadlock (see distributed._NEVER_FREED): there the threads
    stay, and the script ends through os._exit, with no interpreter shutdown to abort.
    """
    skip_strategies_this_torch_lacks(strategy)
    args = [*ARGS, "--epochs", "1", "--limit", "64", "--checkpoint", "ckpt.pt"]
    args += ["--strategy", strategy]
    status, out = run([sys.executable, "-c", CHECK_THREADS, *args], job_env, tmp_path)
    before, after = re.search(r"before (\[.*\]) after (\[.*\])", out).groups()
    assert "status 0" in out and status == 0, out
    if torch_version() >= (2, 8):
        assert before == after and "gloo" not in after, out
    else:
        assert before != after and "Traceback" not in out, out
