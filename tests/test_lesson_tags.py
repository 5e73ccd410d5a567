"""Every "Shown in lesson N" / "(lesson N)" tag in the package names a lesson that shows the name.

A function's or class's docstring may say which lessons show it; the module's docstring may say
which lessons show the module. A tag is right when the lesson's notebook (`notebooks/NN-*.ipynb`,
its code or its text) mentions the tagged name; for a module, its dotted name or any name it
defines. Read with `ast`, so nothing is imported.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "d2l_gpu"
NUMBERS = r"\d+(?:\s*(?:-|–|,|and)\s*\d+)*"
TAG = re.compile(rf"(?:[Ss]hown in lessons?|\(lessons?|^Lessons?)\s+({NUMBERS})", re.M)


def lessons_in(tag: str) -> list[int]:
    """'7 and 10-12' -> [7, 10, 11, 12]."""
    found: list[int] = []
    for part in re.split(r"\s*(?:,|and)\s*", tag.strip()):
        lo, _, hi = part.replace("–", "-").partition("-")
        found += range(int(lo), int(hi or lo) + 1)
    return found


def tags(docstring: str | None) -> list[int]:
    """The lesson numbers that a docstring's tags name."""
    return [n for m in TAG.finditer(docstring or "") for n in lessons_in(m[1])]


def lesson_texts() -> dict[int, str]:
    """Lesson number -> every cell's source of notebooks/NN-*.ipynb, joined."""
    texts = {}
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        texts[int(path.name[:2])] = "\n".join("".join(c["source"]) for c in cells)
    return texts


def dotted(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def path_is_package(module: str) -> bool:
    """Whether `module` is a package: its docstring lists its modules, each with its lessons."""
    return (ROOT.joinpath(*module.split(".")) / "__init__.py").is_file()


def wrong_tags(source: str, module: str, texts: dict[int, str]) -> list[str]:
    """One line per tag in `source` (the code of `module`) that its lesson does not bear out."""
    tree = ast.parse(source)
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
    names = [n.name for n in defs if not n.name.startswith("_")]
    problems = []

    def shows(lesson: int, words: list[str]) -> bool:
        text = texts.get(lesson, "")
        return any(re.search(rf"(?<!\w){re.escape(w)}(?!\w)", text) for w in words)

    table_of_contents = module.count(".") and path_is_package(module)
    for lesson in [] if table_of_contents else tags(ast.get_docstring(tree)):
        packages = [module.rsplit(".", i)[0] for i in range(module.count("."))]  # d2l_gpu.train
        if not shows(lesson, [*packages, module.rsplit(".", 1)[-1] + ".", *names]):
            problems.append(f"{module}: the module is tagged lesson {lesson}, which uses none "
                            "of its names")  # fmt: skip
    for node in defs:
        for lesson in tags(ast.get_docstring(node)):
            if lesson not in texts:
                problems.append(
                    f"{module}.{node.name}: tagged lesson {lesson}, which does not exist"
                )
            elif not shows(lesson, [node.name]):
                problems.append(f"{module}.{node.name}: tagged lesson {lesson}, which does not "
                                "mention it")  # fmt: skip
    return problems


def test_tags_are_read_as_lesson_lists():
    assert lessons_in("7 and 10-12") == [7, 10, 11, 12]
    assert tags('"""Ring all-reduce (lesson 12)."""\nShown in lessons 5, 6 and 9–10.') == [
        12, 5, 6, 9, 10
    ]  # fmt: skip


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: dotted(p))
def test_every_tag_names_a_lesson_that_shows_the_name(path):
    problems = wrong_tags(path.read_text(encoding="utf-8"), dotted(path), lesson_texts())
    assert not problems, "\n".join(problems)


def test_a_wrong_tag_is_found():
    """The negative control: try_gpu tagged with a lesson that never mentions it."""
    texts = {1: "d2l.try_gpu()", 12: "ring_all_reduce(x)"}
    right = 'def try_gpu():\n    """A device (lesson 1)."""\n'
    assert wrong_tags(right, "d2l_gpu.devices", texts) == []
    wrong = 'def try_gpu():\n    """A device (lesson 12)."""\n'
    assert wrong_tags(wrong, "d2l_gpu.devices", texts) == [
        "d2l_gpu.devices.try_gpu: tagged lesson 12, which does not mention it"
    ]
    missing = 'def try_gpu():\n    """A device (lesson 13)."""\n'
    assert "does not exist" in wrong_tags(missing, "d2l_gpu.devices", texts)[0]
