"""The suite's own check that tests leave nothing behind (tests/leftovers.py) can fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import leftovers
import pytest
from leftovers import Snapshot, left_behind, snapshot


def test_a_process_of_the_run_is_found_until_it_ends(tmp_path):
    token = uuid.uuid4().hex  # a run of its own: the session's processes are not counted
    before = snapshot(token, tmp_path)
    env = {**os.environ, leftovers.MARK: token}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        found = left_behind(before, snapshot(token, tmp_path))
        assert found == [f"process {proc.pid} still runs: {sys.executable} -c import time; "
                         "time.sleep(60)"]  # fmt: skip
    finally:
        proc.kill()
        proc.wait()
    assert left_behind(before, snapshot(token, tmp_path)) == []


def test_a_temporary_entry_is_found_but_pytest_and_compile_caches_are_not(tmp_path):
    token = uuid.uuid4().hex
    (tmp_path / "old").mkdir()
    before = snapshot(token, tmp_path)
    for name in ("torchelastic_abc", "pytest-of-root", "torchinductor_root"):
        (tmp_path / name).mkdir()
    assert left_behind(before, snapshot(token, tmp_path)) == [
        "temporary entry left: torchelastic_abc"
    ]


def test_namespaces_and_mounts_added_are_found():
    before = Snapshot(netns={"kept"}, mounts={"proc /proc proc rw 0 0"})
    after = Snapshot(netns={"kept", "d2l-host1"}, mounts={*before.mounts, "tmpfs /x tmpfs rw 0 0"})
    assert left_behind(before, after) == [
        "network namespace d2l-host1 was left",
        "mount left: tmpfs /x tmpfs rw 0 0",
    ]


def test_another_run_is_seen_by_its_mark(tmp_path):
    token = uuid.uuid4().hex
    env = {**os.environ, leftovers.MARK: token}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        assert leftovers.other_sessions(os.environ[leftovers.MARK])
    finally:
        proc.kill()
        proc.wait()


FRESH_MACHINE = """
import subprocess, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from leftovers import left_behind, snapshot
tmp = Path({tmp!r})
assert not Path("/run/netns").exists(), "the fresh /run has a /run/netns already"
before = snapshot("fresh", tmp)
subprocess.run(["ip", "netns", "add", "d2l-fresh"], check=True)
if {remove!r}:
    subprocess.run(["ip", "netns", "del", "d2l-fresh"], check=True)
for line in left_behind(before, snapshot("fresh", tmp)):
    print(line)
"""


@pytest.mark.skipif(
    os.name != "posix" or os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("ip")),
    reason="needs root, unshare and ip (iproute2)",
)
@pytest.mark.parametrize("remove", [True, False])
def test_a_fresh_machine_gains_no_leftover_from_its_first_namespace(tmp_path, remove):
    """Issue 39: on a machine where `ip netns` never ran, its first namespace makes the
    /run/netns mount, which iproute2 keeps; that alone must not fail the run. Shown in a mount
    namespace of this test's own with an empty /run (the machine's mounts are not touched), where
    a namespace left behind (remove=False: the negative control) is still found, with its mount."""
    script = FRESH_MACHINE.format(
        tests=str(Path(__file__).parent), tmp=str(tmp_path), remove=remove
    )
    fresh = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount -t tmpfs d2l-fresh-run /run && exec "$0" -c "$1"',
        sys.executable,
        script,
    ]
    done = subprocess.run(fresh, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    found = done.stdout.splitlines()
    if remove:
        assert found == []
    else:
        assert found[0] == "network namespace d2l-fresh was left"
        assert len(found) == 2 and found[1].startswith("mount left: ")
        assert " /run/netns/d2l-fresh " in found[1]


def test_the_machine_mount_is_ignored_but_a_namespace_mount_under_it_is_not():
    netns = "/dev/vda /run/netns ext4 rw,relatime 0 0"
    one = "nsfs /run/netns/d2l-host1 nsfs rw 0 0"
    assert leftovers._machine_mount(netns) and not leftovers._machine_mount(one)
    assert not leftovers._machine_mount("tmpfs /run/netnsx tmpfs rw 0 0")
