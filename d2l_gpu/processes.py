"""Processes on every platform: is one alive, which are its children, end a whole tree.

POSIX and Windows differ exactly here. On Windows `os.kill(pid, 0)` is no existence check (signal
0 is CTRL_C_EVENT there, and any other number terminates the process), a parent's death does not
change `os.getppid()`, there are no process groups, and there is no `/proc` or `ps`. The lessons'
job runner of lesson 7, `run_workers` of lessons 10-12 and the training script use these functions
instead of the POSIX calls.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

WINDOWS = sys.platform == "win32"


def _windows_alive(pid: int) -> bool:
    """Whether process `pid` is running, asked of the Windows API (OpenProcess)."""
    import ctypes

    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
    handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
    if not handle:
        return ctypes.get_last_error() == 5  # type: ignore[attr-defined]  # access denied: it exists, someone else's
    try:
        code = ctypes.c_ulong()
        ok = kernel32.GetExitCodeProcess(handle, ctypes.byref(code))
        return bool(ok) and code.value == 259  # STILL_ACTIVE
    finally:
        kernel32.CloseHandle(handle)


def pid_alive(pid: int) -> bool:
    """Whether a process with id `pid` is running (another user's counts)."""
    if WINDOWS:
        return _windows_alive(pid)
    try:
        os.kill(pid, 0)  # POSIX: signal 0 checks that the process exists, and does nothing
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def parent_gone(parent: int) -> bool:
    """Whether the process `parent`, which started this one, has ended."""
    if WINDOWS:  # a child keeps its parent's id after the parent dies
        return not pid_alive(parent)
    return os.getppid() != parent  # POSIX: an orphan is handed to another process


def ended(pid: int) -> bool:
    """Whether the process `pid` (not this one's parent) has ended: gone, or a zombie (Linux)."""
    if not pid_alive(pid):
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):  # not Linux (alive, as asked above), or gone meanwhile
        return not pid_alive(pid)


def children(pid: int) -> list[int]:
    """The ids of the processes that `pid` started, oldest first."""
    if Path(f"/proc/{pid}/task").is_dir():  # Linux
        return _proc_children(pid)
    return _portable_children(pid)


def _proc_children(pid: int) -> list[int]:
    """Linux: the children listed under /proc/PID/task/*/children, by id (start order)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return sorted(found)


def _portable_children(pid: int) -> list[int]:
    """Elsewhere: psutil (installed with the locks, IPython needs it), else POSIX `ps`."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        with contextlib.suppress(psutil.Error):
            kids = psutil.Process(pid).children()
            return [p.pid for p in sorted(kids, key=lambda p: (p.create_time(), p.pid))]
        return []
    if WINDOWS:
        raise RuntimeError("listing child processes on Windows needs psutil: pip install psutil")
    out = subprocess.run(["ps", "-A", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    return sorted(int(p) for p, pp in (line.split() for line in out.splitlines()) if int(pp) == pid)


def descendants(pid: int) -> list[int]:
    """The ids of every process that `pid` started, and that those started, and so on."""
    found, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found


def kill_tree(proc: subprocess.Popen) -> None:
    """Kill `proc` and every process it started (started with start_new_session=True on POSIX):
    its process group, and the descendants that left it for a session of their own (torchrun
    starts each worker so), found before the group dies and they are handed to another parent."""
    if WINDOWS:  # no process groups: taskkill walks the tree
        subprocess.run(["taskkill", "/F", "/T", "/PID", str(proc.pid)], capture_output=True)
        with contextlib.suppress(OSError):
            proc.kill()
        return
    others = descendants(proc.pid) if proc.poll() is None else []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in others:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
