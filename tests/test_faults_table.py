"""docs/faults.md names, for each fault tried, the tests that try it: every one must exist.

The table's third column names tests as `test_file.py::test_name` and goes on with bare names
(`test_other`) of the same file, or a whole file (`test_fs.py`). A test renamed or removed leaves
a row that claims what nothing checks any more: this test fails on it, naming the row.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "docs" / "faults.md"
CODE = re.compile(r"`([^`]+)`")
TEST_REF = re.compile(r"^(test_\w+\.py)(?:::(test_\w+))?(?:\[.*\])?$|^(test_\w+)(?:\[.*\])?$")


def defined_functions(path: Path) -> set[str]:
    """The names of the functions a test file defines (at any depth: classes included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def named_tests(table: str) -> list[tuple[str, str, str | None]]:
    """(row, file, function or None) for each test the table's last column names."""
    found = []
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if not row.startswith("|") or len(cells) < 3 or cells[-1] in ("Test", "---"):
            continue
        current = None
        for code in CODE.findall(cells[-1]):
            for part in (p.strip() for p in code.split(",")):
                m = TEST_REF.match(part)
                if not m:
                    continue
                if m.group(1):
                    current = m.group(1)
                    found.append((cells[0][:60], current, m.group(2)))
                elif current:
                    found.append((cells[0][:60], current, m.group(3)))
    return found


def missing(table: str, tests: Path) -> list[str]:
    """The rows' tests that do not exist under `tests`, each with its row."""
    out = []
    for row, file, fn in named_tests(table):
        path = tests / file
        if not path.exists():
            out.append(f"{row!r}: no file tests/{file}")
        elif fn and fn not in defined_functions(path):
            out.append(f"{row!r}: tests/{file} has no {fn}")
    return out


def test_every_test_the_faults_table_names_exists():
    table = TABLE.read_text(encoding="utf-8")
    assert len(named_tests(table)) > 60  # the table really is read
    assert not missing(table, ROOT / "tests"), "\n".join(missing(table, ROOT / "tests"))


@pytest.mark.parametrize(
    "cell",
    ["`test_fs.py::test_gone`", "`test_nowhere.py`", "`test_fs.py::test_x`, `test_also_gone`"],
)
def test_a_row_naming_a_test_that_does_not_exist_fails(cell):
    row = f"| a fault | what happens | {cell} |\n"
    assert missing(row, ROOT / "tests")
