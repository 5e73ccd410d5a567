"""The maps of the code cannot go stale (issue 40): every name of `d2l.`'s lazy map resolves,
the package's and `parallel/`'s docstrings name every module they hold, and no lesson or solution
(English or Chinese) names a `d2l_gpu.` module path that does not exist. Each check has a negative
control: a map with a missing or a made-up entry is caught."""

from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path

import pytest

import d2l_gpu

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "d2l_gpu"
NOTEBOOKS = sorted(
    p for folder in ("notebooks", "solutions") for p in (ROOT / folder).rglob("*.ipynb")
)
DOTTED = re.compile(r"\bd2l_gpu(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def resolves(dotted: str) -> bool:
    """Whether `dotted` (d2l_gpu.a.b.name) is a module of the package or a name inside one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


def unknown_paths(text: str) -> set[str]:
    """The `d2l_gpu.` paths in `text` that do not resolve."""
    return {path for path in set(DOTTED.findall(text)) if not resolves(path)}


def module_names(folder: Path) -> set[str]:
    """The modules of `folder` (files and subpackages), without __init__ and __main__."""
    files = {p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")}
    return files | {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}


def unnamed(docstring: str, names: set[str]) -> set[str]:
    """The module names that `docstring` never mentions as a word."""
    return {n for n in names if not re.search(rf"(?<![\w.]){re.escape(n)}\b", docstring)}


def test_every_name_of_the_lazy_map_resolves():
    missing = []
    for module, names in d2l_gpu._NAMES.items():
        imported = importlib.import_module(f"d2l_gpu.{module}")
        missing += [f"{module}.{name}" for name in names if not hasattr(imported, name)]
    assert not missing, f"d2l_gpu._NAMES maps names that their modules lack: {missing}"
    assert all(getattr(d2l_gpu, name) is not None for name in d2l_gpu.__all__)


def test_a_name_mapped_to_the_wrong_module_fails(monkeypatch):
    """The negative control: a made-up entry is refused with the error a reader would see."""
    monkeypatch.setitem(d2l_gpu._WHERE, "no_such_helper", "devices")
    with pytest.raises(AttributeError):
        d2l_gpu.no_such_helper  # noqa: B018


@pytest.mark.parametrize(
    ("folder", "init"),
    [(PACKAGE, PACKAGE / "__init__.py"), (PACKAGE / "parallel", PACKAGE / "parallel/__init__.py")],
    ids=["d2l_gpu", "d2l_gpu.parallel"],
)
def test_the_docstring_maps_name_every_module(folder, init):
    docstring = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
    assert not unnamed(docstring, module_names(folder)), (
        f"{init.relative_to(ROOT)}'s docstring does not name these modules: "
        f"{sorted(unnamed(docstring, module_names(folder)))}"
    )


def test_the_docstring_check_sees_a_module_left_out():
    assert unnamed("data_parallel.py   data parallelism", {"data_parallel", "mesh3d"}) == {"mesh3d"}
    assert unnamed("see d2l_gpu.parallel.mesh3d", {"mesh3d"}) == {"mesh3d"}  # a path, not a name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(ROOT)) for p in NOTEBOOKS])
def test_lessons_name_only_module_paths_that_exist(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    found = set().union(*(unknown_paths("".join(c["source"])) for c in cells))
    assert not found, f"{path.relative_to(ROOT)} names paths that do not exist: {sorted(found)}"


def test_the_path_check_sees_a_moved_module():
    assert unknown_paths("`d2l_gpu.collectives` and `d2l_gpu.parallel.collectives`") == {
        "d2l_gpu.collectives"
    }
    assert unknown_paths("`d2l_gpu.parallel.costmodel.no_such_function`") == {
        "d2l_gpu.parallel.costmodel.no_such_function"
    }


LESSON_ROW = re.compile(r"^\| (\d+) \| `(\d\d-[^`]+)` \| ([^|]*) \|")


def lesson_modules(code: str) -> list[str]:
    """The package modules that lesson code uses: through `d2l.NAME` (the lazy map says where
    NAME lives) or by path (`from d2l_gpu.parallel import mesh3d`, `d2l_gpu.parallel.costmodel`)."""
    found = {d2l_gpu._WHERE[n] for n in re.findall(r"\bd2l\.(\w+)", code) if n in d2l_gpu._WHERE}
    for path in re.findall(r"\bd2l_gpu((?:\.\w+)+)", code):
        parts = path.strip(".").split(".")
        for cut in range(len(parts), 0, -1):  # the longest prefix that is a module
            if (PACKAGE / "/".join(parts[:cut])).with_suffix(".py").is_file() or (
                PACKAGE / "/".join(parts[:cut]) / "__init__.py"
            ).is_file():
                found.add(".".join(parts[:cut]))
                break
    for package, names in re.findall(r"from d2l_gpu\.(\w+) import ([\w, ]+)", code):
        found |= {f"{package}.{n.strip()}" for n in names.split(",")
                  if (PACKAGE / package / f"{n.strip()}.py").is_file()}  # fmt: skip
    return sorted(found - {"parallel"})


def lesson_rows(text: str) -> dict[str, set[str]]:
    """notebook stem -> the modules a row of the maintainers' lesson table names."""
    return {
        m.group(2): set(re.findall(r"`([\w.]+)`", m.group(3)))
        for m in map(LESSON_ROW.match, text.splitlines())
        if m
    }


def test_the_maintainers_lesson_table_names_what_each_lesson_uses():
    rows = lesson_rows((ROOT / "docs" / "maintaining.md").read_text(encoding="utf-8"))
    lessons = sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))
    assert sorted(rows) == [p.stem for p in lessons]
    for path in lessons:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        used = lesson_modules(code)
        assert rows[path.stem] == set(used), (
            f"docs/maintaining.md's row for {path.stem} should name "
            + ", ".join(f"`{m}`" for m in used)
        )


def test_the_lesson_table_check_sees_a_module_left_out():
    code = "d2l.try_gpu()\nfrom d2l_gpu.parallel import mesh3d\nd2l_gpu.parallel.costmodel.x"
    assert lesson_modules(code) == ["devices", "parallel.costmodel", "parallel.mesh3d"]
    row = "| 14 | `14-x` | `devices`, `parallel.costmodel` | d |"
    assert lesson_rows(row)["14-x"] != set(lesson_modules(code))


SHOWN = re.compile(r"Shown in lessons? ([0-9][0-9, and-]*)")


def shown_in(doc: str) -> list[int]:
    """The lessons a docstring's "Shown in lesson(s) ..." names ("8 and 10-12": 8, 10, 11, 12)."""
    m = SHOWN.search(" ".join(doc.split()))
    if not m:
        return []
    found: list[int] = []
    for first, last in re.findall(r"(\d+)(?:-(\d+))?", m.group(1)):
        found += range(int(first), int(last or first) + 1)
    return found


def used_before_shown(lessons: list[Path]) -> list[str]:
    """Each `d2l.` name a lesson's code uses before the first lesson its own docstring names."""
    import inspect

    import d2l_gpu as d2l

    late = []
    for path in lessons:
        number = int(path.name[:2])
        cells = json.loads(path.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        for name in sorted(set(re.findall(r"\bd2l\.([A-Za-z_]\w*)", code))):
            named = shown_in(inspect.getdoc(getattr(d2l, name, None)) or "")
            if named and min(named) > number:
                late.append(f"lesson {number} uses d2l.{name}, shown in lesson {min(named)}")
    return late


def test_no_lesson_uses_a_name_before_the_lesson_that_shows_it():
    """Issue 42: lesson 8 ran d2l.run_workers, which only lesson 10 explained. A name's docstring
    says where it is taught ("Shown in lesson N"); no lesson may use it earlier."""
    assert shown_in("Run it.\n\n    Shown in lessons 8 and\n    10-12. More.") == [8, 10, 11, 12]
    assert used_before_shown(sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))) == []


def test_used_before_shown_sees_a_name_used_too_early(tmp_path):
    """Negative control: a lesson 2 that calls d2l.run_workers (shown in lesson 8) is caught."""
    nb = {"cells": [{"cell_type": "code", "source": ["d2l.run_workers(f, 2)\n"]}]}
    early = tmp_path / "02-early.ipynb"
    early.write_text(json.dumps(nb))
    assert used_before_shown([early]) == ["lesson 2 uses d2l.run_workers, shown in lesson 8"]
