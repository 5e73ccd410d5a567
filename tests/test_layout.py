"""The package's import rule (see d2l_gpu's docstring): each module imports only the layers its
own layer may use, and no two modules import each other, directly or around a loop.

Every import is read from the source with `ast`, absolute and relative, at the top of a module
or inside a function, so an import that would run late still counts.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "d2l_gpu"

# layer -> the layers its modules may import (its own included); see d2l_gpu/__init__.py
ALLOWED = {
    "core": {"core"},
    "data": {"core", "data"},
    "parallel": {"core", "data", "parallel"},
    "book": {"core", "data", "book"},
    "train": {"core", "data", "parallel", "train"},
}


def module_name(path: Path, root: Path = PACKAGE) -> str:
    """d2l_gpu/train/strategies/base.py -> d2l_gpu.train.strategies.base (a package: its name)."""
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    """The layer of a module: its subpackage, `train` for the script's old name `ddp`, else core."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ALLOWED:
        return parts[1]
    return "train" if parts[1:] == ["ddp"] else "core"


def imports(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of the package that `source` (module `module`) imports, wherever it does."""
    package = module if is_package else module.rpartition(".")[0]
    root = module.split(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == root}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            elif node.module and node.module.split(".")[0] == root:
                base = node.module
            else:
                continue
            for alias in node.names:  # `from . import x`: x may be a module or a name
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return found - {module}


def package_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the package's modules it imports, for every .py file under `root`."""
    paths = sorted(root.rglob("*.py"))
    names = {module_name(p, root): p for p in paths}
    return {
        name: imports(p.read_text(encoding="utf-8"), name, p.name == "__init__.py", set(names))
        for name, p in names.items()
    }


def forbidden(graph: dict[str, set[str]], root: str = "d2l_gpu") -> list[str]:
    """Each import that breaks the rule, said as `a (layer) imports b (layer)`."""
    out = []
    for module, targets in graph.items():
        for target in sorted(targets):
            if module == root:
                out.append(f"{root} imports {target} at import time; use the lazy _NAMES map")
            elif target == root:
                out.append(f"{module} imports {root} itself: import the module that defines it")
            elif layer(target) not in ALLOWED[layer(module)]:
                out.append(
                    f"{module} ({layer(module)}) imports {target} ({layer(target)}): "
                    f"{layer(module)} may import only {', '.join(sorted(ALLOWED[layer(module)]))}"
                )
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles of `graph`, each as the loop of modules (depth-first search)."""
    found, state = [], {}  # state: 1 on the current path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


@pytest.fixture(scope="module")
def graph():
    return package_graph()


def test_every_import_follows_the_layer_rule(graph):
    problems = forbidden(graph)
    assert not problems, "\n".join(problems)


def test_no_import_cycle(graph):
    loops = cycles(graph)
    assert not loops, "\n".join(" -> ".join(loop) for loop in loops)


def test_the_graph_sees_every_layer_and_late_imports(graph):
    """The reader is not blind: each layer has modules, and imports inside functions count."""
    assert {layer(m) for m in graph} == set(ALLOWED)
    source = "def f():\n    from ..models import LeNet\n    import d2l_gpu.devices\n"
    known = {"d2l_gpu.models", "d2l_gpu.devices", "d2l_gpu.train.loop"}
    assert imports(source, "d2l_gpu.train.loop", False, known) == {
        "d2l_gpu.models",
        "d2l_gpu.devices",
    }
    assert imports("from .. import models", "d2l_gpu.train.loop", False, known) == {
        "d2l_gpu.models"
    }


def test_the_checker_refuses_a_forbidden_edge_and_a_cycle():
    """Negative control: a small made-up graph with one wrong import and one loop."""
    bad = {
        "d2l_gpu.devices": {"d2l_gpu.train.loop"},  # core may not import train
        "d2l_gpu.parallel.zero": {"d2l_gpu.book.classes"},  # parallel may not import book
        "d2l_gpu.data.idx": {"d2l_gpu.data.download"},
        "d2l_gpu.data.download": {"d2l_gpu.data.idx"},  # a cycle inside one layer
        "d2l_gpu": {"d2l_gpu.models"},  # the lazy __init__ imports nothing
    }
    problems = forbidden(bad)
    assert any("d2l_gpu.devices (core) imports d2l_gpu.train.loop (train)" in p for p in problems)
    assert any("d2l_gpu.parallel.zero (parallel) imports d2l_gpu.book" in p for p in problems)
    assert any(p.startswith("d2l_gpu imports d2l_gpu.models") for p in problems)
    assert len(problems) == 3
    assert cycles(bad) == [["d2l_gpu.data.download", "d2l_gpu.data.idx", "d2l_gpu.data.download"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
