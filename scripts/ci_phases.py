"""CI's phases timed against their budgets, so that a slowdown is seen when it is added.

    python3 scripts/ci_phases.py begin               # the run starts: its wall time counts
    python3 scripts/ci_phases.py start PYTHON        # this machine's speed, for later phases
    python3 scripts/ci_phases.py run NAME BUDGET -- COMMAND [ARG ...]
    python3 scripts/ci_phases.py report

`run` runs COMMAND, prints how long it took beside its budget, and the CPU time it and its
descendants used, and appends a row to build/ci-phases.tsv; it exits with COMMAND's status.
`report` prints every row as a table, with the wall time since `begin`, and exits 1, with one
sentence per phase, if a phase took more than half again its budget. Phases that run side by
side each count their own seconds; the CPU column shows how much of two cores a phase kept busy
(test-slow's includes its busy loop).

A budget is the seconds a phase takes on the reference machine (docs/testing.md, "How long the tests
take"). On a slower machine every phase is slower alike, so the budgets are scaled by this
machine's speed: a fixed piece of work (start Python, import PyTorch, multiply matrices), timed
once per CI run, against its time on the reference machine. A faster machine keeps the budgets
as they are (the factor is never below 1), so a phase that grew is still caught there.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "build" / "ci-phases.tsv"
Row = tuple[str, float, float, float, int, float]  # name, seconds, budget, factor, status, CPU s
SLACK = 1.5  # a phase fails CI past SLACK times its scaled budget
REFERENCE_SECONDS = 2.7  # the work below on the reference machine (2-core AMD EPYC, AVX-512)
WORK = "import torch; x = torch.randn(256, 256); [x @ x for _ in range(2000)]"


def speed_factor(seconds: float, reference: float = REFERENCE_SECONDS) -> float:
    """How many times slower than the reference machine this one is; never below 1."""
    return max(1.0, seconds / reference)


def overran(seconds: float, budget: float, factor: float) -> bool:
    """Whether a phase took more than SLACK times its budget scaled by `factor`."""
    return seconds > SLACK * budget * factor


def measure_speed(python: str = sys.executable, tries: int = 3) -> float:
    """The fastest of `tries` runs of WORK in a new `python` process, in seconds."""
    best = float("inf")
    for _ in range(tries):
        start = time.perf_counter()
        subprocess.run([python, "-c", WORK], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        best = min(best, time.perf_counter() - start)
    return best


def sentence(name: str, seconds: float, budget: float, factor: float) -> str:
    """Why a phase that overran fails CI, and what to do."""
    return (
        f"CI phase '{name}' took {seconds:.0f} s, more than {SLACK:g} times its budget of "
        f"{budget:.0f} s (x{factor:.2f} for this machine's speed): find what made it slower "
        "(pytest --durations, the notebooks' cell times) before CI nears its 90 minutes, or "
        "raise the budget in .ci/run with the reason."
    )


def read_rows(table: Path | None = None) -> list[Row]:
    """The rows written so far (in TABLE): (name, seconds, budget, factor, status, CPU s)."""
    table = TABLE if table is None else table
    if not table.exists():
        return []
    rows = []
    for line in table.read_text().splitlines():
        name, seconds, budget, factor, status, cpu = line.split("\t")
        rows.append((name, float(seconds), float(budget), float(factor), int(status), float(cpu)))
    return rows


def report(rows: list[Row], wall: float | None = None) -> tuple[str, list[str]]:
    """The table of phases (and the run's `wall` seconds); the sentences of those that overran."""
    lines = [f"{'phase':<24} {'seconds':>8} {'budget':>8} {'limit':>8} {'CPU s':>8}  status"]
    failed = []
    for name, seconds, budget, factor, status, cpu in rows:
        limit = SLACK * budget * factor
        lines.append(
            f"{name:<24} {seconds:>8.0f} {budget:>8.0f} {limit:>8.0f} {cpu:>8.0f}  {status}"
        )
        if overran(seconds, budget, factor):
            failed.append(sentence(name, seconds, budget, factor))
    total = sum(r[1] for r in rows)  # phases that ran side by side count each: not wall time
    cpu = sum(r[5] for r in rows)
    lines.append(f"{'sum of the phases':<24} {total:>8.0f} {'':>17} {cpu:>8.0f}")
    if wall is not None:
        lines.append(f"{'the whole run (wall)':<24} {wall:>8.0f}")
    return "\n".join(lines), failed


def children_cpu() -> float:
    """CPU seconds (user and system) of this process's waited-for descendants so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args == ["begin"]:  # the run's first step: the wall time in `report` counts from here
        TABLE.parent.mkdir(exist_ok=True)
        TABLE.with_name("ci-start").write_text(f"{time.time():.1f}\n")
        return 0
    if args[:1] == ["start"] and len(args) == 2:
        seconds = measure_speed(args[1])
        TABLE.parent.mkdir(exist_ok=True)
        TABLE.with_name("ci-speed").write_text(f"{speed_factor(seconds):.3f}\n")
        print(
            f"this machine: {seconds:.2f} s for the calibration work, {REFERENCE_SECONDS} s on "
            f"the reference machine: budgets x{speed_factor(seconds):.2f}",
            flush=True,
        )
        return 0
    if args[:1] == ["report"] and len(args) == 1:
        start_file = TABLE.with_name("ci-start")
        wall = time.time() - float(start_file.read_text()) if start_file.exists() else None
        table, failed = report(read_rows(), wall)
        print(table, flush=True)
        for said in failed:
            print(said, file=sys.stderr)
        return 1 if failed else 0
    if len(args) < 5 or args[0] != "run" or args[3] != "--" or not args[2].isdigit():
        usage = "begin | start PYTHON | run NAME BUDGET_SECONDS -- COMMAND [ARG ...] | report"
        print(f"usage: ci_phases.py {usage}", file=sys.stderr)
        return 2
    name, budget, command = args[1], float(args[2]), args[4:]
    factor_file = TABLE.with_name("ci-speed")
    factor = float(factor_file.read_text()) if factor_file.exists() else 1.0
    start, cpu = time.monotonic(), children_cpu()
    status = subprocess.call(command, cwd=ROOT)
    seconds, cpu = time.monotonic() - start, children_cpu() - cpu
    TABLE.parent.mkdir(exist_ok=True)
    with TABLE.open("a") as table:
        table.write(f"{name}\t{seconds:.1f}\t{budget:.0f}\t{factor:.3f}\t{status}\t{cpu:.1f}\n")
    print(
        f"phase {name}: {seconds:.0f} s (budget {budget:.0f} s x{factor:.2f}), {cpu:.0f} CPU s",
        flush=True,
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
