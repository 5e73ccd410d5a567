"""Definitions shown in `#@save` notebook cells are identical to those in the d2l_gpu package."""

import ast
import difflib
import importlib
import inspect
import json
import pkgutil
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def normal(text: str) -> str:
    """Dedented text without trailing whitespace or surrounding blank lines."""
    return "\n".join(line.rstrip() for line in textwrap.dedent(text).splitlines()).strip("\n")


def package_definitions(package: str) -> tuple[dict, list[str]]:
    """Map each name defined in any module of `package` to its objects; plus import errors."""
    pkg = importlib.import_module(package)
    modules, errors = [pkg], []
    for info in pkgutil.walk_packages(pkg.__path__, prefix=f"{package}."):
        if info.name.endswith(".__main__"):  # a script: importing it would run it
            continue
        try:
            modules.append(importlib.import_module(info.name))
        except Exception as e:  # noqa: BLE001 - reported with any name it hides
            errors.append(f"{info.name}: {type(e).__name__}: {e}")
    found: dict[str, list] = {}
    for mod in modules:
        for name, obj in vars(mod).items():
            if getattr(obj, "__module__", None) == mod.__name__ and (
                inspect.isfunction(obj) or inspect.isclass(obj)
            ):
                found.setdefault(name, [])
                if obj not in found[name]:
                    found[name].append(obj)
    return found, errors


def save_cells(path: Path) -> list[str]:
    """Sources of the code cells whose first line is `#@save` (`# @save` once ruff-formatted)."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    sources = [
        "".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells
    ]
    return [
        s
        for c, s in zip(cells, sources, strict=True)
        if c["cell_type"] == "code" and re.match(r"#\s*@save\b", s.lstrip())
    ]


def mismatches(source: str, definitions: dict, errors=()) -> list[str]:
    """Every top-level def/class in `source` that is missing from, or differs from, the package."""
    lines, out = source.splitlines(), []
    try:
        body = ast.parse(source).body
    except SyntaxError as e:
        return [f"#@save cell does not parse: {e}"]
    for node in body:
        if not isinstance(node, DEFS):
            continue
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        shown = normal("\n".join(lines[start - 1 : node.end_lineno]))
        objs = definitions.get(node.name)
        if not objs:
            hint = f" (import errors: {'; '.join(errors)})" if errors else ""
            out.append(f"{node.name}: not defined in the package{hint}")
            continue
        for obj in objs:
            packaged = normal(inspect.getsource(obj))
            if packaged != shown:
                diff = difflib.unified_diff(
                    packaged.splitlines(), shown.splitlines(), "package", "notebook", lineterm=""
                )
                out.append(f"{node.name} differs from {obj.__module__}:\n" + "\n".join(diff))
    return out


@pytest.fixture(scope="module")
def d2l_definitions():
    return package_definitions("d2l_gpu")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_saved_code_matches_package(path, d2l_definitions):
    definitions, errors = d2l_definitions
    problems = [m for src in save_cells(path) for m in mismatches(src, definitions, errors)]
    assert not problems, "\n\n".join(problems)


FAKE = '''\
import functools


def add_one(x):
    """Add one."""
    return x + 1


class Box:
    @functools.cache
    def size(self):
        return 1
'''


def test_check_detects_drift(tmp_path, monkeypatch):
    (tmp_path / "fakepkg").mkdir()
    (tmp_path / "fakepkg" / "__init__.py").write_text("from .mod import add_one\n")
    (tmp_path / "fakepkg" / "mod.py").write_text(FAKE)
    monkeypatch.syspath_prepend(str(tmp_path))
    definitions, errors = package_definitions("fakepkg")
    assert not errors and set(definitions) >= {"add_one", "Box"}

    same = "#@save\n" + FAKE.split("\n\n\n", 1)[1] + "\n\nprint('not a definition')\n"
    assert mismatches(same, definitions) == []

    drifted = same.replace("return x + 1", "return x + 2")
    problems = mismatches(drifted, definitions)
    assert (
        len(problems) == 1
        and "add_one differs" in problems[0]
        and "+    return x + 2" in problems[0]
    )

    missing = "#@save\ndef not_packaged():\n    pass\n"
    assert mismatches(missing, definitions) == ["not_packaged: not defined in the package"]
