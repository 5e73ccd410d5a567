"""Reading the lessons' and the solutions' code for scripts/grading.py: which statements are
checks, which cells a student fills in, and the worked solution of each check in solutions/,
fitted to the lesson's own starter."""

from __future__ import annotations

import ast
import re
import textwrap

import nbtools
from IPython.core.inputtransformer2 import TransformerManager

# A check: a top-level `check(...)` call, or a statement that prints "Exercise N: ...".
CHECK_CALL = re.compile(r"^check\(|print\(\s*f?\"Exercise \d+:", re.MULTILINE)


class GradingError(ValueError):
    """A lesson whose exercises cannot be turned into graded cells (named, with the cell)."""


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
