"""The suite's own check that tests leave nothing behind (tests/leftovers.py) can fail."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import leftovers
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
