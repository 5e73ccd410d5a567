"""Validate notebooks (strict nbval) on a slower machine: one core, shared with a busy loop.

    python scripts/slow_machine.py NB [NB ...]

A notebook whose compared output holds only at one machine's speed (a kill "5 seconds after
launch", two ranks' lines that happen not to interleave) passes on the machine it was executed on
and fails on a faster or slower one. This runs nbval with every process pinned to CPU 0 (taskset)
while a busy loop competes for that core, so such a notebook fails here, on any machine, instead
of on a student's. Linux only (taskset); elsewhere it says so and exits 2.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUSY = "while True: pass"
REPORT = ROOT / "build" / "junit-slow.xml"  # this run's cells, for the seconds per notebook


def seconds_per_notebook(report: Path) -> list[str]:
    """One line per notebook of a pytest JUnit report: its cells' seconds, the longest first."""
    seconds: Counter[str] = Counter()
    for case in ET.parse(report).iter("testcase"):
        seconds[case.get("classname", "?").replace(".", "/", 1)] += float(case.get("time", 0))
    return [f"{s:8.1f} s  {name}" for name, s in seconds.most_common()]


def main(argv: list[str] | None = None) -> int:
    notebooks = sys.argv[1:] if argv is None else argv
    if not notebooks:
        print("usage: slow_machine.py NB [NB ...]", file=sys.stderr)
        return 2
    missing = [nb for nb in notebooks if not (ROOT / nb).is_file()]
    if missing:
        print(f"slow_machine: no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    taskset = shutil.which("taskset")
    if taskset is None:
        print(
            "slow_machine: needs taskset (Linux, util-linux) to pin the run to one core",
            file=sys.stderr,
        )
        return 2
    busy = subprocess.Popen([taskset, "-c", "0", sys.executable, "-c", BUSY])
    try:
        cmd = [taskset, "-c", "0", sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env"]
        cmd += ["--nbval-sanitize-with", "nbval_sanitize.cfg", "-p", "no:cacheprovider", *notebooks]
        REPORT.parent.mkdir(exist_ok=True)
        REPORT.unlink(missing_ok=True)
        cmd += ["--junitxml", str(REPORT)]
        print("slow machine: CPU 0 only, shared with a busy loop:", " ".join(notebooks), flush=True)
        status = subprocess.call(cmd, cwd=ROOT)
        if REPORT.is_file():
            print("seconds per notebook on the slow machine:", *seconds_per_notebook(REPORT),
                  sep="\n")  # fmt: skip
        return status
    finally:
        busy.kill()
        busy.wait()


if __name__ == "__main__":
    sys.exit(main())
