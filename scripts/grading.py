"""Build an nbgrader course from the lessons, one graded assignment per lesson.

    python scripts/grading.py [--out DIR] [--zh | --vi] [LESSON ...]   # default: build/grading

Each assignment (`source/<lesson>/<lesson>.ipynb`) is the lesson itself up to its exercises. From
the `## Exercises` heading on, a locked cell defines `must_pass()`; every exercise's starter cells
become autograded answer cells that hold the worked solution of `solutions/` between nbgrader's
`### BEGIN SOLUTION` and `### END SOLUTION`; and every check becomes a locked test cell, worth one
point, that runs the lesson's own check inside `with must_pass():`, which fails unless the check
said `correct` (or `...: True`), then hidden tests: each plausible wrong answer that tests/answers
feeds that check must still be refused. `nbgrader generate_assignment` releases the lesson's own
starter cells, which `grading_release.py` (copied into the course) puts back from each answer
cell's metadata. grading_code.py reads the lessons' and solutions' code. See docs/grading.md.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
from IPython.core.inputtransformer2 import TransformerManager

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import nbtools  # noqa: E402
from grading_code import (  # noqa: E402
    CHECK_CALL,
    GradingError,
    _defined,
    helpers,
    imports,
    indented,
    is_starter,
    joined,
    label,
    merged,
    solution_for,
    split_check,
    statements,
)
from grading_written import NEW_EXERCISE, written, written_cell  # noqa: E402

from d2l_gpu._fs import write_atomic  # noqa: E402

PASS = re.compile(r"^(correct|Exercise \d+: .*: True)$")
REFUSAL = re.compile(r"^(not yet|not answered yet|Exercise \d+: (not |.*: False$))")
SOLUTION = ("### BEGIN SOLUTION", "### END SOLUTION")
EXERCISES = ("## Exercises", "## 练习", "## Bài tập")  # the heading in each edition
# exercises left out of grading, and why: their solutions run only when the student opts in
OPTIONAL = {
    ("08-performance-lab", "Exercise 3"): "torch.compile builds C++ code first (needs a compiler)",
    ("09-speed-one-gpu", "Exercise 5"): "torch.compile of ResNet-18 builds C++ for minutes",
}

MUST_PASS = '''\
import contextlib
import io
import re


class must_pass:  # noqa: N801 (used as `with must_pass():`, like contextlib.suppress)
    """Run an exercise's checks; fail unless every one said `correct` (or `...: True`)."""

    def __enter__(self):
        self.said = io.StringIO()
        self.redirect = contextlib.redirect_stdout(self.said)
        self.redirect.__enter__()

    def __exit__(self, *error):
        self.redirect.__exit__(*error)
        print(self.said.getvalue(), end="")
        if error[0] is None:  # a check that raised fails with its own error
            lines = [line.strip() for line in self.said.getvalue().splitlines()]
            passed = re.compile(PASS_RULE)
            refused = re.compile(REFUSAL_RULE)
            ok = any(map(passed.match, lines)) and not any(map(refused.match, lines))
            assert ok, "the check above did not say correct: see its hint"
'''.replace("PASS_RULE", repr(PASS.pattern)).replace("REFUSAL_RULE", repr(REFUSAL.pattern))


def passed(printed: str) -> bool:
    """A check passed if it printed a passing verdict and no refusal (a cell may hold several)."""
    lines = [ln.strip() for ln in printed.splitlines()]
    return any(PASS.match(ln) for ln in lines) and not any(REFUSAL.match(ln) for ln in lines)


@dataclass
class Exercise:
    """One check of a lesson: its starter cells, its check and its worked solution."""

    starters: list[int]  # indices of the lesson's cells the student fills in
    at: int  # the index of the check cell
    head: str  # what the check cell asks to fill in before its checks
    check: str  # the checks, and what follows them in the cell
    solution: str


def exercises_at(nb) -> int:
    """The index of a notebook's `## Exercises` heading (`## 练习`, `## Bài tập` in the others)."""
    for i, c in enumerate(nb["cells"]):
        heading = nbtools._source(c).lstrip()
        if c["cell_type"] == "markdown" and heading.startswith(EXERCISES):
            return i
    raise GradingError("no `## Exercises` heading")


def exercises(nb, sol, stem: str) -> list[Exercise]:
    """Every graded check of lesson `nb`, with its starter cells and its solution from `sol`."""
    found, pending = [], []
    # the solutions' first code cell sets up what the lesson set up
    cells = [nbtools._source(c) for c in sol["cells"] if c["cell_type"] == "code"][1:]
    solutions = [statements(c) for c in cells]
    after = (-1, -1)
    lesson = {n for c in nb["cells"] if c["cell_type"] == "code" for n in _defined(c)}
    for i in range(exercises_at(nb) + 1, len(nb["cells"])):
        cell = nb["cells"][i]
        source = nbtools._source(cell)
        if cell["cell_type"] != "code":
            if NEW_EXERCISE.match(source):  # what came before belongs to the exercise before
                pending = []
            continue
        if not CHECK_CALL.search(source):
            if is_starter(source):
                pending.append(i)
            continue
        head, check = split_check(source)
        if (stem, label(check)) in OPTIONAL:
            pending = []
            continue
        alone = bool(pending) or not head  # the answer lives in cells before the check
        worked, after = solution_for(solutions, check, after, alone)
        starter = [(k, s) for k in pending for s in statements(nbtools._source(nb["cells"][k]))]
        starter += [(i, s) for s in statements(head)] if head else []
        solution = joined(merged(starter, worked, lesson) or worked)
        found.append(Exercise(pending, i, head, check, solution))
        pending = []
    return found


def _cell(source: str, grade_id: str, **nbgrader) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    flags = {"grade": False, "solution": False, "locked": False, **nbgrader}
    cell.metadata["nbgrader"] = {**flags, "grade_id": grade_id, "schema_version": 3}
    return cell


def assignment(nb, sol, stem: str, english=None, edition: str = "") -> nbformat.NotebookNode:
    """The graded source notebook of one lesson (of `edition`, whose English lesson is
    `english`; default: `nb` is English)."""
    out = nbformat.from_dict(copy.deepcopy(nb))
    at = exercises_at(nb)
    graded: dict[int, list[nbformat.NotebookNode]] = {at: [out["cells"][at]]}
    graded[at].append(_cell(imports(nb, sol) + MUST_PASS, "must-pass", locked=True))
    given = helpers(nb, sol)  # defined in the first answer, before its solution
    for n, e in enumerate(exercises(nb, sol, stem), start=1):
        starter = "\n\n\n".join([nbtools._source(nb["cells"][i]) for i in e.starters] + [e.head])
        solution = "\n\n\n".join(s for s in (given, e.solution) if s) if n == 1 else e.solution
        answer = _cell(
            "\n".join([SOLUTION[0], solution, SOLUTION[1]]), f"answer-{n}", solution=True
        )
        answer.metadata["d2l_gpu"] = {"starter": starter.strip("\n")}
        cases = [c for c in wrong_answers(stem) if c.cell in starter + e.check]
        check = (
            "with must_pass():\n"
            + indented(e.check)
            + hidden(nb["cells"][e.at], cases, f"{stem} {n}")
        )
        test = _cell(check, f"check-{n}", grade=True, locked=True)
        test.metadata["nbgrader"]["points"] = 1
        first = e.starters[0] if e.starters else e.at
        for i in e.starters:
            graded[i] = []
        graded[first] = [answer]
        graded[e.at] = [answer, test] if first == e.at else [test]
    english = english if english is not None else nb
    for w in written(nb, sol, english, exercises_at(english)):
        graded[w.last] = [*graded.get(w.last, [out["cells"][w.last]]), written_cell(w, edition)]
    cells = []
    for i, cell in enumerate(out["cells"]):
        for c in graded.get(i, [cell]):
            if c["cell_type"] == "code":
                c["outputs"], c["execution_count"] = [], None
            cells.append(c)
    out["cells"] = cells
    out["metadata"].pop("d2l_gpu", None)  # the lesson's execution record is not this notebook's
    return out


HIDDEN = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")
REFUSE = """\
# a known wrong answer ({why}) must still be refused. It runs on a copy of the
# notebook's names: a `check`, or a helper of it, redefined to pass anything fails here.
_code, _name = {program!r}, "<a wrong answer {name}>"
__import__("linecache").cache[_name] = (len(_code), None, _code.splitlines(True), _name)
_said = __import__("io").StringIO()
with __import__("contextlib").redirect_stdout(_said):
    exec(compile(_code, _name, "exec"), dict(globals()))  # (inspect finds its functions)
_said = [_line.strip() for _line in _said.getvalue().splitlines()]
assert _said and not (
    any(__import__("re").match({passing!r}, _line) for _line in _said)
    and not any(__import__("re").match({refusing!r}, _line) for _line in _said)
), "the check passed a known wrong answer: was `check`, or a helper it uses, redefined?"
"""


def wrong_answers(stem: str) -> list:
    """The cases of tests/answers for a lesson: each a check's right and plausible wrong answer."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    module = importlib.import_module(f"answers.l{stem[:2]}")
    return list(module.CASES) if module.NOTEBOOK == f"{stem}.ipynb" else []


def hidden(check_cell, cases: list, name: str = "") -> str:
    """Hidden tests for a check cell: each plausible wrong answer of `cases`, run as its case
    runs it (its code, then the lesson's check cell with its edits), must still be refused."""
    tests = []
    for k, case in enumerate(cases, start=1):
        program = nbtools._source(check_cell)
        for old, new in case.wrong.replace:
            program = program.replace(old, new)
        program = TransformerManager().transform_cell(case.wrong.code + "\n" + program)
        tests.append(
            REFUSE.format(
                why=case.why,
                program=program,
                name=f"{name} {k}",
                passing=PASS.pattern,
                refusing=REFUSAL.pattern,
            )
        )
    return "".join(["\n", HIDDEN[0], "\n", *tests, HIDDEN[1]]) if tests else ""


def build(out: Path, stems: list[str], edition: str = "") -> list[Path]:
    """Write the course folder `out` for the lessons `stems` (of `edition`: "" English, "zh", "vi"
    Chinese, whose code is the same); return the assignments written."""
    written = []
    for stem in stems:
        lesson = Path("notebooks", edition, f"{stem}.ipynb")
        nb = nbtools.load(ROOT / lesson)
        sol = nbtools.load(ROOT / "solutions" / edition / f"{stem}.ipynb")
        english = nbtools.load(ROOT / "notebooks" / f"{stem}.ipynb") if edition else nb
        try:
            graded = assignment(nb, sol, stem, english, edition)
        except GradingError as e:
            raise GradingError(f"{lesson.as_posix()}: {e}") from None
        path = out / "source" / stem / f"{stem}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, nbformat.writes(graded) + "\n")
        written.append(path)
    for name, target in (("grading_config.py", "nbgrader_config.py"), ("grading_release.py", "")):
        write_atomic(out / (target or name), (ROOT / "scripts" / name).read_text())
    return written


def lessons() -> list[str]:
    return sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "lessons", nargs="*", metavar="LESSON", help="e.g. 02-tensors (default: all)"
    )
    parser.add_argument("--out", type=Path, help="the course folder (default: build/grading)")
    language = parser.add_mutually_exclusive_group()
    language.add_argument("--zh", action="store_true", help="the Chinese one (build/grading-zh)")
    language.add_argument("--vi", action="store_true", help="the Vietnamese one (build/grading-vi)")
    args = parser.parse_args(argv)
    known = lessons()
    wanted = [next((k for k in known if k == w or k.startswith(f"{w}-")), w) for w in args.lessons]
    unknown = [w for w in wanted if w not in known]
    if unknown:
        parser.error(f"no lesson {', '.join(unknown)}: give names like 02 or 02-tensors")
    edition = "zh" if args.zh else "vi" if args.vi else ""
    args.out = args.out or ROOT / "build" / (f"grading-{edition}" if edition else "grading")
    try:
        paths = build(args.out, wanted or known, edition)
    except GradingError as e:
        print(f"grading.py: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # --out a file, or a folder we may not write
        print(
            f"grading.py: cannot write the course to --out {args.out}: {e.strerror}",
            file=sys.stderr,
        )
        return 1
    cells = [c for p in paths for c in nbformat.read(p, as_version=4).cells]
    points = sum(c.metadata.get("nbgrader", {}).get("points", 0) for c in cells)
    hiding = sum(c.source.count("must still be refused") for c in cells if c.cell_type == "code")
    by_hand = sum(c.cell_type == "markdown" and "nbgrader" in c.metadata for c in cells)
    print(f"{len(paths)} assignments, {points} points ({by_hand} of them written answers graded "
          f"by hand), {hiding} hidden tests, in {args.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
