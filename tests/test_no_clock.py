"""No compared output is decided by the clock: conditions on elapsed time make a notebook pass on
one machine and fail on a faster or slower one (issue 20: a rank killed "5 seconds after launch").

The scan reads every code cell of every lesson and solution whose output nbval compares (cells
tagged nbval-ignore-output print numbers nobody compares) and flags a comparison (`<`, `>`, `==`,
...) one of whose sides is a clock reading or a timing: a call such as `time.monotonic()` or
`d2l.measure(...)`, or a name assigned from one anywhere earlier in the notebook (`t0`,
`elapsed`, `t_book`). Wait for an event instead (a line printed, a file written, a step count),
or print the timing in an ignored cell and compare a property that holds on every machine.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbtools
import pytest
from IPython.core.inputtransformer2 import TransformerManager

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted(
    (ROOT / "solutions").glob("*.ipynb")
)
CLOCKS = {
    "time", "monotonic", "perf_counter", "perf_counter_ns", "monotonic_ns", "time_ns",
    "process_time", "measure", "blocked_autorange", "timeit", "elapsed_time", "step_seconds",
}  # fmt: skip
# workers that time what they run: the seconds they return are clock readings
TIMING_WORKERS = {
    "time_ops", "pingpong_worker", "collective_worker", "overlap_worker",
    "backward_overlap_worker", "server_step_worker",
}  # fmt: skip


KEYS_ONLY = {"len", "sorted", "set", "keys"}
TIME_ATTRIBUTES = {"median", "mean", "iqr", "times", "raw_times"}  # of a timing's result
IDENTITY = (ast.Is, ast.IsNot, ast.In, ast.NotIn)  # `t is ...` asks whether it was answered


def _called_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(
            f, ast.Attribute
        ):  # link.time(n) is a model's prediction; time.time() a clock
            return None if f.attr == "time" and getattr(f.value, "id", None) != "time" else f.attr
        return getattr(f, "id", None)
    return None


def reads_clock(node: ast.AST, timed: set[str]) -> bool:
    """Does the expression call a clock or timing function, or read a name that holds a timing?

    What `len(...)` counts is not a time, so its argument is not looked at."""
    if _called_name(node) in KEYS_ONLY:  # len(times), sorted(times): counts and keys, not times
        return False
    if getattr(node, "attr", getattr(node, "id", None)) in TIMING_WORKERS:  # run_workers(it, ...)
        return True
    if isinstance(node, ast.Attribute) and node.attr not in TIME_ATTRIBUTES:
        return any(_called_name(sub) in CLOCKS for sub in ast.walk(node.value))  # m.task_spec
    if _called_name(node) in CLOCKS or (isinstance(node, ast.Name) and node.id in timed):
        return True
    return any(reads_clock(child, timed) for child in ast.iter_child_nodes(node))


def _names(target: ast.AST) -> list[str]:
    """The names a target binds; `times[k] = ...` binds (part of) `times`."""
    if isinstance(target, ast.Subscript):
        return _names(target.value)
    if isinstance(target, ast.Starred):
        return _names(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for elt in target.elts for n in _names(elt)]
    return [target.id] if isinstance(target, ast.Name) else []


def track(statements: list[ast.stmt], timed: set[str]) -> None:
    """Follow the statements in order: a name holds a timing from a clock assignment on, until
    it is assigned something else (a later `t = torch.ones(3)` is a tensor again)."""
    for node in statements:
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None:
            clock = reads_clock(node.value, timed)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                partial = isinstance(target, ast.Subscript) or isinstance(node, ast.AugAssign)
                for name in _names(target):
                    if clock:
                        timed.add(name)
                    elif not partial:
                        timed.discard(name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner = set(timed)
            track(node.body, inner)
            returns = [r.value for r in ast.walk(node) if isinstance(r, ast.Return) and r.value]
            if any(reads_clock(r, inner) for r in returns):
                timed.add(node.name)
            else:
                timed.discard(node.name)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            for name in _names(node.target):
                timed.discard(name)
            track(node.body, timed)
            track(node.orelse, timed)
        elif isinstance(node, (ast.If, ast.While, ast.With, ast.Try)):
            for block in ("body", "orelse", "finalbody"):
                track(getattr(node, block, []), timed)
            for handler in getattr(node, "handlers", []):
                track(handler.body, timed)


def consistency_check(node: ast.Compare) -> bool:
    """`abs(a - b) <= tol * c`: two numbers computed from the same timings agree up to rounding,
    which holds on a fast and a slow machine alike (a speed-up checked against its times)."""
    if len(node.ops) != 1 or not isinstance(node.ops[0], (ast.LtE, ast.Lt)):
        return False
    left, right = node.left, node.comparators[0]
    if _called_name(left) != "abs" or not left.args or not isinstance(left.args[0], ast.BinOp):
        return False
    if not isinstance(left.args[0].op, ast.Sub):
        return False
    terms = [right.left, right.right] if isinstance(right, ast.BinOp) else [right]
    if isinstance(right, ast.BinOp) and isinstance(right.op, ast.Add):  # tol * x + tiny
        terms = [
            t
            for side in (right.left, right.right)
            if isinstance(side, ast.BinOp)
            for t in (side.left, side.right)
        ]
    return any(
        isinstance(t, ast.Constant) and isinstance(t.value, float) and 0 < t.value <= 1e-3
        for t in terms
    )


# Comparisons on timings whose printed verdict still holds at any speed, each with the reason.
ALLOWED = {
    ("05-data-parallel.ipynb", "t_book < t_split"): "recomputes the winner from the student's own "
    "two times; the check prints whether the student named it, True at any speed",
    ("05-data-parallel.ipynb", "winner == faster"): "the same check",
    ("08-performance-lab.ipynb", "first_call > 100 * compiled_times[0]"): "compiling takes seconds "
    "and a compiled call on one element microseconds, 10**4 to 10**6 apart on any machine; the "
    "committed starter never runs it (RUN_COMPILE = False)",
    ("12-synchronisation.ipynb", "small < 16 * tiny"): "each size's cheapest of 4 x rounds "
    "ping-pong rounds (load only adds time): 256 B-4 KiB over 4-64 B measured 1.00-1.27, idle and "
    "on one core shared with a busy loop (2026-11-27); time in proportion to bytes gives 64",
    ("12-synchronisation.ipynb", "largest > 4 * large"): "the same cheapest rounds: 16 MiB over "
    "1 MiB measured 14-32 idle and on one shared core; the model's ratio stays over 4 while "
    "n_1/2 = alpha * beta is under 4 MiB (0.25 MB here; the full profile compares 16 and 256 MiB, "
    "under 64 MiB); a time that did not grow with bytes gives 1",
    ("12-synchronisation.ipynb", 'real_ps["rel_diff"] < 1e-5'): "a sum checked against the "
    "collective library's, no time in it",
    ("12-synchronisation.ipynb", 'after["all_reduces"] == buckets["all_reduces"] == 4'): "counts "
    "the all-reduce events in each trace: as many as buckets, at any speed",
    ("12-synchronisation.ipynb", 'buckets["launched_in_backward"] == 3'): "an order of events "
    "on one thread: the hooks launch buckets 1-3 before the first layer's gradient is computed, "
    "at any speed (when gloo's thread runs them depends on the load: not compared)",
    ("12-synchronisation.ipynb", 'after["launched_in_backward"] == 0'): "an order of events: that "
    "schedule launches its first all-reduce after the backward pass has returned",
}


def _compares(node: ast.AST, bound: frozenset):
    """Each comparison under `node`, with the names a lambda around it binds (`lambda t: ...`:
    that `t` is the lambda's argument, not a timing of the same name outside)."""
    if isinstance(node, ast.Lambda):
        bound = bound | {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
    if isinstance(node, ast.Compare):
        yield node, bound
    for child in ast.iter_child_nodes(node):
        yield from _compares(child, bound)


def clock_conditions(nb, name: str = "") -> list[str]:
    """'cell N: source line' for each comparison on a clock reading in a compared cell."""
    timed: set[str] = set()
    found = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        src = TransformerManager().transform_cell(nbtools._source(cell))
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        track(tree.body, timed)
        if "nbval-ignore-output" in cell.get("metadata", {}).get("tags", []):
            continue
        for node, bound in _compares(tree, frozenset()):
            if all(isinstance(op, IDENTITY) for op in node.ops) or consistency_check(node):
                continue
            if any(reads_clock(side, timed - bound) for side in [node.left, *node.comparators]):
                text = ast.get_source_segment(src, node)
                if (name, text) not in ALLOWED:
                    found.append(f"cell {i}: {text}")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[f"{p.parent.name}/{p.name}" for p in NOTEBOOKS])
def test_no_compared_output_depends_on_the_clock(path):
    found = clock_conditions(nbtools.load(path), path.name)
    assert not found, "conditions on elapsed time in compared cells: " + "; ".join(found)


def test_the_scan_finds_a_kill_on_the_clock():
    """Negative control: the condition lesson 7 once had, and others like it, are found."""

    def nb(*sources, ignored=False):
        meta = {"tags": ["nbval-ignore-output"]} if ignored else {}
        return {"cells": [{"cell_type": "code", "source": s, "metadata": meta} for s in sources]}

    kill = "run = launch_and_kill(cmd, rank=0, when=lambda: time.monotonic() > t0 + 5)"
    assert clock_conditions(nb("t0 = time.monotonic()", kill))
    assert clock_conditions(nb("t = d2l.measure(f)", "print('faster:', t < 1e-3)"))
    assert clock_conditions(nb("times = {}\ntimes[1] = d2l.measure(f)", "print(times[1] > 0)"))
    assert clock_conditions(
        nb("def step():\n    return time.perf_counter() - t0", "ok = step() < 2")
    )
    # an event, an ignored cell and a printed (not compared) timing are fine
    assert not clock_conditions(nb('run = launch_and_kill(cmd, 0, lambda out: "epoch 1" in out)'))
    assert not clock_conditions(nb("t = d2l.measure(f)", "print(t < 1)", ignored=True))
    assert not clock_conditions(nb("t = d2l.measure(f)", "print(f'{t:.3f} s')"))
    assert not clock_conditions(nb("print(link.time(2**20) < 1)"))  # a model, not a clock
    consistent = "t = {1: d2l.measure(f)}\nprint(abs(s[1] * t[1] - t[1]) <= 1e-9 * t[1], sorted(t))"
    assert not clock_conditions(nb(consistent))  # holds at any speed
    assert clock_conditions(nb("t = {1: d2l.measure(f)}", "print(abs(t[1]) < 1e-3)"))  # a threshold
    assert clock_conditions(nb("t = d2l.measure(f)", "print(abs(t - 0.001) < 0.5)"))
    # a worker that times what it runs, handed to run_workers, returns clock readings
    pingpong = "p2p = d2l.run_workers(costmodel.pingpong_worker, 2, sizes)[0]"
    assert clock_conditions(nb(pingpong, "print(p2p[4] < p2p[64])"))
    # a lambda's argument is not the timing of the same name outside it
    assert not clock_conditions(nb("t = d2l.measure(f)", "check(x, lambda t: t['n'] == 1)"))
    assert clock_conditions(nb("t = d2l.measure(f)", "check(x, lambda u: t < 1)"))
