"""What a test run leaves behind: processes, network namespaces, mounts, temporary files.

The unit suite runs with its own temporary folder (TMPDIR) and marks every process it starts
with an environment variable, so what it leaves is told apart from what else runs on the machine.
`tests/conftest.py` takes a snapshot when the session starts and fails the run if, at its end,
a marked process still runs, a network namespace or a mount was added, or a file or folder was
left in the session's temporary folder (pytest's own `tmp_path` folders and PyTorch's compile
cache excepted). Linux only: elsewhere the process and mount parts find nothing.

One mount is the machine's, not a test's: the first `ip netns add` on a machine bind-mounts
/run/netns onto itself (so that namespaces can be shared), and iproute2 keeps that mount for
good, after every namespace is gone. A fresh machine gains it in the first test that makes a
namespace; tests/test_leftovers.py shows, in a mount namespace of its own without it, that a
namespace made and removed leaves nothing counted, and that one left behind still is.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

MARK = "D2L_GPU_TEST_SESSION"  # environment variable every process of the session inherits
KEPT = ("pytest-of-", "torchinductor_")  # pytest's own folders, PyTorch's compile cache
MACHINE_MOUNTS = ("/run/netns",)  # mount points made once per machine by iproute2 and kept


@dataclass
class Snapshot:
    """Processes carrying the session's mark, namespaces, mounts and temporary entries."""

    processes: dict[int, str] = field(default_factory=dict)
    netns: set[str] = field(default_factory=set)
    mounts: set[str] = field(default_factory=set)
    tmp: set[str] = field(default_factory=set)


def marked_processes(token: str) -> dict[int, str]:
    """{pid: command line} of the processes (other than this one) whose environment has token."""
    found, needle = {}, f"{MARK}={token}".encode()
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if pid == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state, parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if state == "Z":  # a zombie has ended; only its parent's wait is missing
            continue
        if int(parent) == os.getpid() and any(
            helper in cmdline
            for helper in ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
        ):
            continue  # multiprocessing's tracker and fork server: they end when this process ends
        found[pid] = cmdline.strip()
    return found


def snapshot(token: str, tmp: Path) -> Snapshot:
    """The state that a test run must leave as it found it."""
    netns_dir, mounts = Path("/run/netns"), Path("/proc/mounts")
    entries = {p.name for p in tmp.iterdir()} if tmp.is_dir() else set()
    return Snapshot(
        processes=marked_processes(token),
        netns=set(os.listdir(netns_dir)) if netns_dir.is_dir() else set(),
        mounts={
            line
            for line in (mounts.read_text().splitlines() if mounts.exists() else [])
            if not _machine_mount(line)
        },
        tmp={name for name in entries if not name.startswith(KEPT)},
    )


def _machine_mount(line: str) -> bool:
    """Whether a /proc/mounts line is one of MACHINE_MOUNTS (the mount point itself only)."""
    fields = line.split()
    return len(fields) > 1 and fields[1] in MACHINE_MOUNTS


def left_behind(before: Snapshot, after: Snapshot) -> list[str]:
    """One sentence per thing in `after` that was not in `before`."""
    said = [f"process {pid} still runs: {cmd[:200]}" for pid, cmd in after.processes.items()
            if pid not in before.processes]  # fmt: skip
    said += [f"network namespace {name} was left" for name in sorted(after.netns - before.netns)]
    said += [f"mount left: {line}" for line in sorted(after.mounts - before.mounts)]
    said += [f"temporary entry left: {name}" for name in sorted(after.tmp - before.tmp)]
    return said


def other_sessions(token: str) -> bool:
    """Whether another test run (another mark) is running on this machine right now."""
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            for item in (entry / "environ").read_bytes().split(b"\0"):
                if item.startswith(f"{MARK}=".encode()) and item != f"{MARK}={token}".encode():
                    return True
        except OSError:
            continue
    return False


def wait_until_clean(before: Snapshot, token: str, tmp: Path, seconds: float = 20.0) -> list[str]:
    """left_behind, after giving processes up to `seconds` to finish ending (polled, not slept).

    Namespaces and mounts belong to the whole machine: while another test run is going on, the
    ones it made cannot be told from this run's, so they are not counted then."""
    deadline = time.monotonic() + seconds
    while True:
        found = left_behind(before, snapshot(token, tmp))
        if found and other_sessions(token):
            found = [s for s in found if not s.startswith(("network namespace", "mount left"))]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)
