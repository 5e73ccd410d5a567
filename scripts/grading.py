"""Build an nbgrader course from the lessons, one graded assignment per lesson.

    python scripts/grading.py [--out DIR] [--zh] [LESSON ...]   # default: build/grading, all

Each assignment (`source/<lesson>/<lesson>.ipynb`) is the lesson itself up to its exercises. From
the `## Exercises` heading on, a locked cell defines `must_pass()`; every exercise's starter cells
become autograded answer cells that hold the worked solution of `solutions/` between nbgrader's
`### BEGIN SOLUTION` and `### END SOLUTION`; and every check becomes a locked test cell, worth one
point, that runs the lesson's own check inside `with must_pass():`, which fails unless the check
said `correct` (or `...: True`). `nbgrader generate_assignment` then releases the lesson's own
starter cells, which `grading_release.py` (copied into the course) puts back from each answer
cell's metadata. See docs/grading.md.
"""

from __future__ import annotations

import argparse
import ast
import copy
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import nbformat
from IPython.core.inputtransformer2 import TransformerManager

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import nbtools  # noqa: E402

from d2l_gpu._fs import write_atomic  # noqa: E402

# A check: a top-level `check(...)` call, or a statement that prints "Exercise N: ...".
CHECK_CALL = re.compile(r"^check\(|print\(\s*f?\"Exercise \d+:", re.MULTILINE)
PASS = re.compile(r"^(correct|Exercise \d+: .*: True)$")
REFUSAL = re.compile(r"^(not yet|not answered yet|Exercise \d+: (not |.*: False$))")
SOLUTION = ("### BEGIN SOLUTION", "### END SOLUTION")
NEW_EXERCISE = re.compile(r"^\d+\. \*\*")  # "3. **Fix the bug.**": an exercise's text begins
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


class GradingError(ValueError):
    """A lesson whose exercises cannot be turned into graded cells (named, with the cell)."""


def passed(printed: str) -> bool:
    """A check passed if it printed a passing verdict and no refusal (a cell may hold several)."""
    lines = [ln.strip() for ln in printed.splitlines()]
    return any(PASS.match(ln) for ln in lines) and not any(REFUSAL.match(ln) for ln in lines)


def statements(source: str) -> list[str]:
    """The top-level statements of a cell's source, each as its text (comments between dropped)."""
    lines = source.splitlines()
    python = TransformerManager().transform_cell(source)
    if python.splitlines() != lines:  # a magic rewritten: keep the cell whole
        return [source]
    return ["\n".join(lines[s.lineno - 1 : s.end_lineno]) for s in ast.parse(python).body]


def is_starter(source: str) -> bool:
    """A cell the student fills in: a `TODO`, or a `...` not compared (`x is ...` tests for one)."""
    if re.search(r"#.*\bTODO\b", source):
        return True
    tree = ast.parse(TransformerManager().transform_cell(source))
    compared = {id(n) for c in ast.walk(tree) if isinstance(c, ast.Compare) for n in ast.walk(c)}
    return any(
        isinstance(n, ast.Constant) and n.value is ... and id(n) not in compared
        for n in ast.walk(tree)
    )


def split_check(source: str) -> tuple[str, str]:
    """A check cell as (the answer before its first check, the checks and what follows)."""
    parts = statements(source)
    first = next((i for i, s in enumerate(parts) if CHECK_CALL.search(s)), None)
    if first is None:
        raise GradingError(f"no check statement in {source.splitlines()[0]!r}")
    head = source[: source.index(parts[first])] if first else ""
    return head.strip("\n"), source[source.index(parts[first]) :].strip("\n")


def indented(code: str) -> str:
    """`code` indented under a `with`, refused if that changes what it means (a long string)."""
    inner = textwrap.indent(code, "    ", lambda line: True)
    wrapped = ast.parse("with must_pass():\n" + inner).body[0]
    assert isinstance(wrapped, ast.With)
    if ast.dump(ast.Module(wrapped.body, [])) != ast.dump(ast.parse(code)):
        raise GradingError(f"the check {code.splitlines()[0]!r} changes meaning when indented")
    return inner


@dataclass
class Exercise:
    """One check of a lesson: its starter cells, its check and its worked solution."""

    starters: list[int]  # indices of the lesson's cells the student fills in
    at: int  # the index of the check cell
    head: str  # what the check cell asks to fill in before its checks
    check: str  # the checks, and what follows them in the cell
    solution: str


def exercises_at(nb) -> int:
    """The index of a notebook's `## Exercises` heading (`## 练习` in the Chinese edition)."""
    for i, c in enumerate(nb["cells"]):
        heading = nbtools._source(c).lstrip()
        if c["cell_type"] == "markdown" and heading.startswith(("## Exercises", "## 练习")):
            return i
    raise GradingError("no `## Exercises` heading")


def solution_for(
    solutions: list[list[str]], check: str, after: tuple[int, int], cells_before: bool
) -> tuple[str, tuple[int, int]]:
    """The worked solution of `check` in the solutions' code cells (as statements), and its end.

    The solutions hold the same check (perhaps formatted otherwise); the statements before it in
    its cell, after the previous exercise's check (`after`, a cell and a statement), are its
    solution; with `cells_before` (the lesson asks for it in cells of its own) the cells since
    that check too, less checks, and less the prints that end the previous exercise's cell."""
    # a check call by what it checks (`check(answer,`): a solution may check it more closely
    signs = [_bare(s).split(",")[0] + "," for s in statements(check) if CHECK_CALL.match(s)][:1]
    if not signs:  # an `if ... else print("Exercise N: ...")` cell: its first line and label
        signs = [_bare(g) for g in [check.splitlines()[0], f'"{label(check)}:']]
    places = [(i, j) for i, cell in enumerate(solutions) for j in range(len(cell))]
    found = [
        (i, j)
        for i, j in places
        if (i, j) > after
        and _bare(solutions[i][j]).startswith(signs[0])
        and all(g in _bare(solutions[i][j]) for g in signs)
    ]
    if not found:
        raise GradingError(f"no cell of the solutions holds the check {check.splitlines()[0]!r}")
    end = found[0]
    kept = []
    for i, j in places:
        if not after < (i, j) < end or CHECK_CALL.search(solutions[i][j]):
            continue
        if i != end[0] and not cells_before:
            continue
        if i == after[0] and solutions[i][j].startswith("print("):
            continue  # what the previous exercise printed of its result
        kept.append((i, solutions[i][j]))
    return kept, end


def joined(statements_: list[tuple[int, str]]) -> str:
    """Statements (each with the cell it came from) as code, spaced as ruff formats it."""
    text = ""
    for k, (i, statement) in enumerate(statements_):
        if k:  # two blank lines around a definition and between cells
            before = statements_[k - 1]
            apart = before[0] != i or any(_defines(s) for s in (before[1], statement))
            text += "\n\n\n" if apart else "\n"
        text += statement
    return text


def merged(
    starter: list[tuple[int, str]], solution: list[tuple[int, str]], lesson: set[str]
) -> list[tuple[int, str]] | None:
    """The starter with each statement that asks for work (a `...`, a TODO) replaced by the
    solution's statement that binds the same names, after the solution's statements that set
    what it uses and the lesson lacks (in the solution's order); None when a statement that asks
    for work has no such counterpart. The starter's other statements stay: the check may rely on
    what they set up."""
    binding = {frozenset(_names(s)): k for k, (_, s) in enumerate(solution) if _names(s)}
    asks = [s for _, s in starter if _asks(s)]
    if not asks or any(frozenset(_names(s)) not in binding for s in asks):
        return None
    taken: set[int] = set()

    def needed(k: int) -> list[int]:
        """The solution statements before `k` that set a name statement k uses, transitively."""
        wanted = _loads(solution[k][1]) - lesson
        found = [j for j in range(k) if j not in taken and _stores(solution[j][1]) & wanted]
        taken.update(found)
        return sorted({i for j in found for i in needed(j)} | set(found))

    out = []
    for i, s in starter:
        if not _asks(s):
            out.append((i, s))
            continue
        k = binding[frozenset(_names(s))]
        taken.add(k)
        out += [(i, solution[j][1]) for j in needed(k)] + [(i, solution[k][1])]
    return out


def _stores(statement: str) -> set[str]:
    """Every name a statement sets, in loops and branches too (not inside a function's body)."""
    node = ast.parse(statement).body[0]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    return {
        n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }


def _asks(statement: str) -> bool:
    return bool(re.search(r"#.*\bTODO\b", statement)) or is_starter(statement)


def _loads(statement: str) -> set[str]:
    tree = ast.parse(statement)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _defines(statement: str) -> bool:
    return statement.startswith(("def ", "class ", "@", "async def "))


def _bare(code: str) -> str:
    return re.sub(r"\s+", "", code)


def label(check: str) -> str:
    """The exercise a check belongs to as its verdict names it ("Exercise 3"), or ""."""
    found = re.search(r'"(Exercise \d+):', check)
    return found.group(1) if found else ""


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


def imports(nb, sol) -> str:
    """The imports of the solutions' set-up cell that the lesson lacks (its solutions use them)."""
    lesson = {s for c in nb["cells"] if c["cell_type"] == "code" for s in _imports(c)}
    first = next(c for c in sol["cells"] if c["cell_type"] == "code")
    missing = [s for s in _imports(first) if s not in lesson]
    return "".join(f"{s}  # the worked solutions use it\n" for s in missing)


def helpers(nb, sol) -> str:
    """What the solutions' set-up cell defines that the lesson does not (helpers its solutions
    call), less imports: a statement whose every name is new to the lesson."""
    lesson = {n for c in nb["cells"] if c["cell_type"] == "code" for n in _defined(c)}
    first = next(c for c in sol["cells"] if c["cell_type"] == "code")
    new = [
        s
        for s in statements(nbtools._source(first))
        if not s.startswith(("import ", "from ")) and (names := _names(s)) and not names & lesson
    ]
    return "\n\n\n".join(new)


def _names(statement: str) -> set[str]:
    """The names a top-level statement binds (but `_`)."""
    node = ast.parse(statement).body[0]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else []
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    found = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return found - {"_"}


def _defined(cell) -> set[str]:
    source = nbtools._source(cell)
    try:
        return {n for s in statements(source) for n in _names(s)}
    except SyntaxError:  # a cell of magics
        return set()


def _imports(cell) -> list[str]:
    return [s for s in statements(nbtools._source(cell)) if s.startswith(("import ", "from "))]


def _cell(source: str, grade_id: str, **nbgrader) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    flags = {"grade": False, "solution": False, "locked": False, **nbgrader}
    cell.metadata["nbgrader"] = {**flags, "grade_id": grade_id, "schema_version": 3}
    return cell


def assignment(nb, sol, stem: str) -> nbformat.NotebookNode:
    """The graded source notebook of one lesson."""
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
        test = _cell(
            "with must_pass():\n" + indented(e.check), f"check-{n}", grade=True, locked=True
        )
        test.metadata["nbgrader"]["points"] = 1
        first = e.starters[0] if e.starters else e.at
        for i in e.starters:
            graded[i] = []
        graded[first] = [answer]
        graded[e.at] = [answer, test] if first == e.at else [test]
    cells = []
    for i, cell in enumerate(out["cells"]):
        for c in graded.get(i, [cell]):
            if c["cell_type"] == "code":
                c["outputs"], c["execution_count"] = [], None
            cells.append(c)
    out["cells"] = cells
    out["metadata"].pop("d2l_gpu", None)  # the lesson's execution record is not this notebook's
    return out


def build(out: Path, stems: list[str], edition: str = "") -> list[Path]:
    """Write the course folder `out` for the lessons `stems` (of `edition`: "" English, "zh"
    Chinese, whose code is the same); return the assignments written."""
    written = []
    for stem in stems:
        lesson = Path("notebooks", edition, f"{stem}.ipynb")
        nb = nbtools.load(ROOT / lesson)
        sol = nbtools.load(ROOT / "solutions" / edition / f"{stem}.ipynb")
        try:
            graded = assignment(nb, sol, stem)
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
    parser.add_argument("--zh", action="store_true", help="the Chinese edition (build/grading-zh)")
    args = parser.parse_args(argv)
    known = lessons()
    wanted = [next((k for k in known if k == w or k.startswith(f"{w}-")), w) for w in args.lessons]
    unknown = [w for w in wanted if w not in known]
    if unknown:
        parser.error(f"no lesson {', '.join(unknown)}: give names like 02 or 02-tensors")
    args.out = args.out or ROOT / "build" / ("grading-zh" if args.zh else "grading")
    try:
        paths = build(args.out, wanted or known, "zh" if args.zh else "")
    except GradingError as e:
        print(f"grading.py: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # --out a file, or a folder we may not write
        print(
            f"grading.py: cannot write the course to --out {args.out}: {e.strerror}",
            file=sys.stderr,
        )
        return 1
    points = sum(
        c.metadata.get("nbgrader", {}).get("points", 0)
        for p in paths
        for c in nbformat.read(p, as_version=4).cells
    )
    print(f"{len(paths)} assignments, {points} points, in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
