"""Run a command (a script, a torchrun job) from a lesson or a test, and kill one of its workers
when something has happened. Shown in lesson 7.

Every command runs in a process group of its own, which is killed when the command ends, fails
or times out, so no worker outlives the call. A kill is decided by an *event* in the job's output
(a line it printed, a file it wrote), never by a number of seconds: the same kill lands at the same
point of the job on a fast machine and on a slow one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from . import _checks
from ._typed import wrap_public
from .distributed import worker_pids
from .processes import kill_tree

__all__ = ["Finished", "kill_worker", "launch", "launch_and_kill", "launch_nodes", "run_job"]


@dataclass(frozen=True)
class Finished:
    """What a job did: its exit status, its output, and whether the asked-for kill happened."""

    returncode: int
    output: str
    killed: bool


def kill_worker(agent_pid: int, rank: int) -> bool:
    """SIGKILL the worker of local rank `rank` that the torchrun agent `agent_pid` started.

    Shown in lesson 7. The other workers are paused (SIGSTOP) around the kill and continued after
    it, so that none of them gets further between the decision and the kill, however loaded the
    machine is. Returns False if that worker does not exist (yet, or any more)."""
    if not all(type(n) is int and n >= 0 for n in (agent_pid, rank)):
        raise ValueError(f"kill_worker needs a pid and a rank >= 0, got {agent_pid!r}, {rank!r}")
    pids = worker_pids(agent_pid)
    if rank not in pids:
        return False
    stop, cont = getattr(signal, "SIGSTOP", None), getattr(signal, "SIGCONT", None)
    others = [pid for r, pid in pids.items() if r != rank]
    for pid in others if stop else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, stop)
    try:
        os.kill(pids[rank], getattr(signal, "SIGKILL", signal.SIGTERM))  # like a crash: no clean-up
    except ProcessLookupError:
        return False
    finally:
        for pid in others if cont else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, cont)
    return True


def _check_cmd(caller: str, cmd) -> None:
    """Refuse a command that is a string or empty: Popen wants a list of arguments."""
    if isinstance(cmd, (str, bytes)):
        raise TypeError(
            f"{caller}: cmd must be a list of arguments such as [sys.executable, 'train.py'], "
            f"got the string {cmd!r}; split it with shlex.split"
        )
    _checks.items(f"{caller}: cmd", cmd)


LAST_OUTPUT_S = 30.0  # how long an ended job's last output may take to arrive


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill `proc` and the processes it started (its process group; its tree on Windows)."""
    kill_tree(proc)


def _started(cmd, cwd, env) -> tuple[subprocess.Popen, list[str], threading.Thread]:
    """`cmd` started in a process group of its own, with a thread collecting its output lines."""
    proc = subprocess.Popen(
        list(cmd), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, errors="replace", start_new_session=True,
    )  # fmt: skip
    chunks: list[str] = []
    reader = threading.Thread(
        target=chunks.extend, args=(iter(proc.stdout.readline, ""),), daemon=True
    )
    reader.start()
    return proc, chunks, reader


def _ended(proc: subprocess.Popen, reader: threading.Thread) -> None:
    """Kill what is left of `proc`'s group, wait for it and for the last of its output."""
    _kill_group(proc)
    proc.wait()
    reader.join(timeout=LAST_OUTPUT_S)
    if not reader.is_alive():  # else a process outside the tree still holds the pipe open, and
        proc.stdout.close()  # close() would wait for the reading thread's lock, forever


def run_job(
    cmd: Sequence[str],
    *,
    cwd=None,
    env: dict | None = None,
    timeout: float = 300.0,
    kill_rank: int | None = None,
    when: Callable[[str], bool] | None = None,
) -> Finished:
    """Run `cmd` to its end; with `when`, kill worker `kill_rank` once `when(output)` is true.

    Used by `kill_worker` and `launch`, which lesson 7 shows. Raises TimeoutError, with the job's
    last output, if it runs past `timeout` seconds (a limit for a job that hangs, never what
    decides a kill)."""
    if (when is None) != (kill_rank is None):
        raise ValueError("run_job: give both kill_rank and when, or neither")
    _check_cmd("run_job", cmd)
    if when is not None:
        _checks.callable_("run_job: when", when)
        _checks.whole("run_job: kill_rank", kill_rank, least=0)
    if not timeout > 0:
        raise ValueError(f"run_job: timeout must be a positive number of seconds, not {timeout!r}")
    proc, chunks, reader = _started(cmd, cwd, env)
    killed, late = False, False
    try:
        deadline = time.monotonic() + timeout
        while proc.poll() is None and not late:
            if when is not None and not killed and when("".join(chunks)):
                killed = kill_worker(proc.pid, kill_rank)
            late = time.monotonic() > deadline
            time.sleep(0.005 if when is not None and not killed else 0.05)
    finally:  # whatever happened: no worker survives the call
        _ended(proc, reader)
    output = "".join(chunks)
    if late:
        tail = "\n".join(output.splitlines()[-20:])
        raise TimeoutError(
            f"{' '.join(map(str, cmd[:4]))} ... did not end within {timeout:g} s and was killed; "
            f"pass a larger timeout= if it is just slow. Its last output:\n{tail}"
        )
    return Finished(proc.returncode, output, killed)


def launch(cmd: Sequence[str], *, cwd=None, env=None, timeout: float = 300.0, check=True) -> str:
    """Run `cmd` in a process group of its own; return its output (stdout and stderr together).

    Shown in lesson 7. With `check`, a non-zero exit raises RuntimeError with the output."""
    _check_cmd("launch", cmd)
    job = run_job(cmd, cwd=cwd, env=env, timeout=timeout)
    if check and job.returncode != 0:
        raise RuntimeError(
            f"{' '.join(map(str, cmd[:3]))} ... exited with {job.returncode}:\n{job.output}"
        )
    return job.output


def launch_and_kill(
    cmd: Sequence[str], rank: int, when: Callable[[str], bool], *, cwd=None, env=None, timeout=300.0
) -> str:
    """Run `cmd` like `launch`; SIGKILL the worker of local rank `rank` once `when(output)` holds.

    Shown in lesson 7: `when=lambda out: "saved checkpoint (epoch 1)" in out` kills right after the
    first checkpoint, on any machine. Returns the output (with the agent's report of the kill)."""
    _check_cmd("launch_and_kill", cmd)
    _checks.whole("launch_and_kill: rank", rank, least=0)
    _checks.callable_("launch_and_kill: when", when)
    return run_job(cmd, cwd=cwd, env=env, timeout=timeout, kill_rank=rank, when=when).output


def launch_nodes(
    cmds: Sequence[Sequence[str]],
    leaving: int,
    when: Callable[[str], bool],
    *,
    cwd=None,
    env=None,
    timeout: float = 300.0,
) -> list[Finished]:
    """Run the commands at once, one torchrun agent each, as the machines ("nodes") of one job;
    once `when(everything printed so far)` holds, switch machine `leaving` off (SIGKILL to its
    agent and workers at once) and run the others to their end; what each did, in order.

    Shown in lesson 7: with `--nnodes 1:2` the remaining agent re-forms the job without the
    machine that left. Raises TimeoutError past `timeout` seconds, like `run_job`."""
    for cmd in _checks.items("launch_nodes: cmds", cmds, least=2):
        _check_cmd("launch_nodes", cmd)
    _checks.whole("launch_nodes: leaving", leaving, least=0, most=len(cmds) - 1)
    _checks.callable_("launch_nodes: when", when)
    if not timeout > 0:
        raise ValueError(
            f"launch_nodes: timeout must be a positive number of seconds, not {timeout!r}"
        )
    procs, chunks, readers = zip(*(_started(cmd, cwd, env) for cmd in cmds), strict=True)
    switched_off, late = False, False
    try:
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs) and not late:
            if not switched_off and when("".join(line for c in chunks for line in c)):
                _kill_group(procs[leaving])  # the agent and its workers, like a power cut
                switched_off = True
            late = time.monotonic() > deadline
            time.sleep(0.005 if not switched_off else 0.05)
    finally:
        for proc, reader in zip(procs, readers, strict=True):
            _ended(proc, reader)
    outputs = ["".join(c) for c in chunks]
    if late:
        tail = "\n".join(outputs[0].splitlines()[-20:])
        raise TimeoutError(
            f"launch_nodes: the {len(cmds)} machines did not end within {timeout:g} s and were "
            f"killed; pass a larger timeout= if they are just slow. The first one's last output:\n"
            f"{tail}"
        )
    return [
        Finished(p.returncode, out, switched_off and i == leaving)
        for i, (p, out) in enumerate(zip(procs, outputs, strict=True))
    ]


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
