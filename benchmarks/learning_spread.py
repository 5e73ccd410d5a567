"""How much do the "it learns" figures of tests/test_recipes.py vary? Measure, then check margins.

    python benchmarks/learning_spread.py [--seeds 10] [--json PATH]

Runs `train_toy` of tests/test_recipes.py for every option of its OPTIONS and for compile (eager
backend), with seeds 0..N-1, once with OMP_NUM_THREADS=1 and once with the default threads (each
in a fresh process, so the CPU kernels really change). Prints, per option and over all runs, the
range of the final test accuracy and of the last/first epoch loss ratio, then checks that the
test's thresholds keep a margin of at least twice the spread from the worst run:

    MIN_ACC <= min(acc) - 2 * (max(acc) - min(acc))
    MAX_LOSS_RATIO >= max(ratio) + 2 * (max(ratio) - min(ratio))

Exits 1 when a threshold is too tight for what this machine measured. Run it on a new kind of
machine (another CPU vendor, ARM, a GPU host) before trusting the thresholds there.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib.util
import json
import os
import platform
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_test_module():
    """tests/test_recipes.py as a module (it is a test file, not a package module)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # d2l_gpu from this checkout, as pytest's pythonpath does
    spec = importlib.util.spec_from_file_location("test_recipes", ROOT / "tests/test_recipes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(seeds: int) -> list[dict]:
    """Every option x seed in this process: one row each."""
    import torch

    warnings.filterwarnings("ignore")  # GradScaler's skipped first steps warn about the order
    t = load_test_module()
    torch.compile = functools.partial(torch.compile, backend="eager")  # as the test does
    options = {**t.OPTIONS, "compile": {"compile": True}}
    rows = []
    for name, opts in options.items():
        for seed in range(seeds):
            r = t.train_toy(seed=seed, **opts)
            rows.append(
                {
                    "option": name,
                    "seed": seed,
                    "threads": torch.get_num_threads(),
                    "acc": r["test_acc"],
                    "ratio": t.loss_ratio(r),
                }
            )
    return rows


def spread(values: list[float]) -> tuple[float, float, float]:
    """(min, max, max - min)."""
    return min(values), max(values), max(values) - min(values)


def check(rows: list[dict], min_acc: float, max_ratio: float) -> list[str]:
    """Threshold problems: empty when both margins are at least twice the measured spread."""
    lo, _, s = spread([r["acc"] for r in rows])
    problems = []
    if min_acc > lo - 2 * s:
        problems.append(f"MIN_ACC {min_acc} > lowest {lo:.3f} - 2 x spread {s:.3f}")
    _, hi, s = spread([r["ratio"] for r in rows])
    if max_ratio < hi + 2 * s:
        problems.append(f"MAX_LOSS_RATIO {max_ratio} < highest {hi:.3f} + 2 x spread {s:.3f}")
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--json", type=Path, default=ROOT / "build" / "learning_spread.json")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(args.seeds)))
        return 0
    rows = []
    for threads in ("1", None):  # OMP_NUM_THREADS=1, then the default
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        if threads:
            env["OMP_NUM_THREADS"] = threads
        cmd = [sys.executable, __file__, "--worker", "--seeds", str(args.seeds)]
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        rows += json.loads(out.splitlines()[-1])

    def line(name: str, mine: list[dict]) -> str:
        a, b = spread([r["acc"] for r in mine]), spread([r["ratio"] for r in mine])
        return f"{name:<16} {len(mine):>4}  {a[0]:.3f} - {a[1]:.3f}  {b[0]:>7.3f} - {b[1]:.3f}"

    print(f"{'option':<16} {'runs':>4}  {'test acc':>13}  {'last/first loss':>15}")
    for name in dict.fromkeys(r["option"] for r in rows):
        print(line(name, [r for r in rows if r["option"] == name]))
    print(line("all", rows))
    acc, ratio = spread([r["acc"] for r in rows]), spread([r["ratio"] for r in rows])
    print(f"spread: test acc {acc[2]:.3f}, loss ratio {ratio[2]:.3f}")
    t = load_test_module()
    problems = check(rows, t.MIN_ACC, t.MAX_LOSS_RATIO)
    from d2l_gpu.perf import cpu_name

    machine = f"{cpu_name()}, {os.cpu_count()} cores"
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": machine,
        "python": platform.python_version(),
        "thresholds": {"MIN_ACC": t.MIN_ACC, "MAX_LOSS_RATIO": t.MAX_LOSS_RATIO},
        "problems": problems,
        "rows": rows,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    for problem in problems:
        print(f"TOO TIGHT: {problem}")
    print("thresholds keep twice the spread" if not problems else "thresholds too tight")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
