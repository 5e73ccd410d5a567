"""d2l_gpu.processes: the POSIX calls and their Windows counterparts (the platform faked)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import pytest

from d2l_gpu import processes

PARENT_OF_TWO = (
    "import subprocess, sys, time\n"
    "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
    " for _ in range(2)]\n"
    "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def parent_of_two():
    """A process that started two children; (its Popen, the children's ids in start order)."""
    proc = subprocess.Popen([sys.executable, "-c", PARENT_OF_TWO], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    kids = [int(p) for p in proc.stdout.readline().split()]
    yield proc, kids
    processes.kill_tree(proc)
    proc.wait()
    proc.stdout.close()


def test_alive_and_ended_processes():
    assert processes.pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its id is free
    assert not processes.pid_alive(child.pid)


def test_children_in_start_order_by_every_route(parent_of_two, monkeypatch):
    proc, kids = parent_of_two
    assert processes.children(proc.pid) == kids
    assert processes._portable_children(proc.pid) == kids  # psutil
    monkeypatch.setitem(sys.modules, "psutil", None)  # no psutil: POSIX ps
    assert processes._portable_children(proc.pid) == kids


def test_kill_tree_ends_the_children_too(parent_of_two):
    proc, kids = parent_of_two
    processes.kill_tree(proc)
    proc.wait()
    deadline = time.monotonic() + 10
    while any(processes.pid_alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.05)  # the killed children become zombies until init reaps them
    alive = [k for k in kids if processes.pid_alive(k) and _state(k) != "Z"]
    assert alive == []


# a child in a session of its own (as torchrun starts its workers), with a child of its own
LEFT_THE_GROUP = (
    "import subprocess, sys, time\n"
    "kid = subprocess.Popen([sys.executable, '-c', 'import subprocess, sys, time; "
    'g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]); '
    "print(g.pid, flush=True); time.sleep(60)'], start_new_session=True, stdout=subprocess.PIPE,"
    " text=True)\n"
    "print(kid.pid, kid.stdout.readline().strip(), flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.mark.skipif(sys.platform == "win32", reason="sessions and process groups are POSIX")
@pytest.mark.parametrize("whole_tree", [True, False])
def test_kill_tree_ends_descendants_that_left_the_group(whole_tree):
    """A worker in a session of its own (torchrun's) and its child die with the tree; killing
    the process group alone (the negative control, what kill_tree did before) leaves them."""
    proc = subprocess.Popen([sys.executable, "-c", LEFT_THE_GROUP], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    kids = [int(p) for p in proc.stdout.readline().split()]
    try:
        if whole_tree:
            processes.kill_tree(proc)
        else:
            os.killpg(proc.pid, 9)
        proc.wait()
        deadline = time.monotonic() + (10 if whole_tree else 0.5)  # the control: they stay
        while time.monotonic() < deadline and any(_state(k) not in ("Z", "gone") for k in kids):
            time.sleep(0.05)
        alive = [k for k in kids if _state(k) not in ("Z", "gone")]
        assert alive == ([] if whole_tree else kids)
    finally:
        for k in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(k, 9)
        proc.stdout.close()


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_windows_asks_the_api_and_never_signals(monkeypatch):
    """On Windows os.kill(pid, 0) would send Ctrl-C, and os.getppid() never changes."""
    monkeypatch.setattr(processes, "WINDOWS", True)
    asked = []
    monkeypatch.setattr(processes, "_windows_alive", lambda pid: asked.append(pid) or pid == 7)
    monkeypatch.setattr(os, "kill", lambda *a: pytest.fail(f"os.kill{a} called on Windows"))
    assert processes.pid_alive(7) and not processes.pid_alive(8)
    assert processes.parent_gone(8) and not processes.parent_gone(7)
    assert asked == [7, 8, 8, 7]


def test_windows_kills_the_tree_with_taskkill(monkeypatch):
    monkeypatch.setattr(processes, "WINDOWS", True)
    ran = []
    monkeypatch.setattr(processes.subprocess, "run", lambda cmd, **kw: ran.append(cmd))
    monkeypatch.setattr(os, "killpg", lambda *a: pytest.fail("no process groups on Windows"))

    class Proc:
        pid, killed = 1234, False

        def kill(self):
            self.killed = True

    proc = Proc()
    processes.kill_tree(proc)
    assert ran == [["taskkill", "/F", "/T", "/PID", "1234"]] and proc.killed


def test_windows_without_psutil_says_what_to_install(monkeypatch):
    monkeypatch.setattr(processes, "WINDOWS", True)
    monkeypatch.setitem(sys.modules, "psutil", None)
    with pytest.raises(RuntimeError, match="pip install psutil"):
        processes._portable_children(1)
