"""Every exercise check passes a right answer and refuses a plausible wrong one.

The cases live in tests/answers/ (one module per lesson; see its docstring). A check cell is a
code cell of a lesson's `## Exercises` section that calls `check(` or prints `"Exercise N:`;
every one of them must have a case, so a new exercise cannot arrive without a wrong answer.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import linecache
import pkgutil
from pathlib import Path

import nbtools
import pytest
from answers import Answer, Case
from grading import passed  # the rule the graded course's tests apply too
from grading_code import CHECK_CALL
from IPython.core.inputtransformer2 import TransformerManager

ROOT = Path(__file__).resolve().parent.parent


def lesson_modules() -> list:
    """The modules of tests/answers, one per lesson."""
    import answers

    return [
        importlib.import_module(f"answers.{m.name}") for m in pkgutil.iter_modules(answers.__path__)
    ]


def exercise_cells(nb) -> list[dict]:
    """The code cells from the `## Exercises` heading on."""
    for i, c in enumerate(nb["cells"]):
        if c["cell_type"] == "markdown" and nbtools._source(c).lstrip().startswith("## Exercises"):
            return [c for c in nb["cells"][i:] if c["cell_type"] == "code"]
    return []


def check_cells(nb) -> list[dict]:
    """The exercise cells that give a verdict."""
    return [c for c in exercise_cells(nb) if CHECK_CALL.search(nbtools._source(c))]


def find(nb, needle: str) -> str:
    """The source of the one code cell of `nb` that contains `needle`."""
    found = [
        nbtools._source(c)
        for c in nb["cells"]
        if c["cell_type"] == "code" and needle in nbtools._source(c)
    ]
    assert len(found) == 1, f"{len(found)} code cells contain {needle!r}, expected 1"
    return found[0]


def verdict(nb, case: Case, answer: Answer) -> str:
    """Run the case's context, the answer and the check cell; return what the check printed."""
    cell = find(nb, case.cell)
    for old, new in answer.replace:
        assert old in cell, f"{old!r} is not in the check cell"
        cell = cell.replace(old, new)
    contexts = [find(nb, c) for c in case.context]
    if case.shared_context:
        key = tuple(contexts)  # the cells' sources: the same text computes the same names
        if key not in _CONTEXTS:
            _CONTEXTS[key] = run_cells(contexts, {"__name__": "__main__"})
        said, names = _CONTEXTS[key]
        return said + run_cells([answer.code, cell], dict(names), first=len(contexts))[0]
    return run_cells([*contexts, answer.code, cell], {"__name__": "__main__"})[0]


_CONTEXTS: dict[tuple[str, ...], tuple[str, dict]] = {}  # shared contexts, run once (above)


def run_cells(sources: list[str], namespace: dict, first: int = 0) -> tuple[str, dict]:
    """Run `sources` as notebook cells in `namespace`; (what they printed, the namespace)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for i, src in enumerate(sources, start=first):
            code = TransformerManager().transform_cell(src)
            name = f"<cell {i}>"  # in linecache, as IPython keeps its cells: inspect finds them
            linecache.cache[name] = (len(code), None, code.splitlines(keepends=True), name)
            exec(compile(code, name, "exec"), namespace)  # noqa: S102
    return out.getvalue(), namespace


def all_cases() -> list:
    params = []
    for module in lesson_modules():
        nb_name = module.NOTEBOOK
        for i, case in enumerate(module.CASES):
            params.append(
                pytest.param(nb_name, case, id=f"{Path(nb_name).stem}-{i}-{case.why[:40]}")
            )
    return params


@pytest.fixture(scope="module")
def notebooks() -> dict:
    return {p.name: nbtools.load(p) for p in (ROOT / "notebooks").glob("*.ipynb")}


@pytest.mark.parametrize(("name", "case"), all_cases())
def test_check_passes_right_and_refuses_wrong(name, case, notebooks, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a check that writes files writes them here
    nb = notebooks[name]
    right = verdict(nb, case, case.right)
    assert passed(right), f"the right answer did not pass: {right!r}"
    wrong = verdict(nb, case, case.wrong)
    assert wrong.strip(), "the wrong answer printed no verdict"
    assert not passed(wrong), f"the wrong answer ({case.why}) passed: {wrong!r}"


def test_every_check_cell_has_a_case(notebooks):
    by_name = {m.NOTEBOOK: m.CASES for m in lesson_modules()}
    missing = []
    for name, nb in sorted(notebooks.items()):
        cases = by_name.get(name, [])
        for cell in check_cells(nb):
            src = nbtools._source(cell)
            if not any(case.cell in src for case in cases):
                missing.append(f"{name}: {nbtools.first_line(cell)!r}")
    assert not missing, "exercise checks with no right/wrong case in tests/answers: " + "; ".join(
        missing
    )


def test_pass_rule_reads_verdicts():
    assert passed("correct\n") and passed("Exercise 2: the difference grows: True\n")
    assert not passed("not yet: count again\n") and not passed("Exercise 2: grows: False\n")
    assert not passed("Exercise 3: not done yet: fill in t\n") and not passed("")
    assert not passed("not yet: float32 is 4 bytes\ncorrect\n")  # one of two checks refused
