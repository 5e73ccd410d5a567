"""Rules of GPU code that a CPU run cannot show, checked on the source of d2l_gpu.

`fully_shard` without a mesh builds one on the machine's accelerator: on a GPU machine whose
ranks run on the CPU with gloo (more ranks than GPUs), it moved lesson 11's model to cuda:0 and
the step failed on the first GPU run (reports/gpu/2026-11-30-h200.md). Every call must name its
mesh, built on the rank's own device.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "d2l_gpu"


def calls_without_mesh(source: str) -> list[int]:
    """Lines of `fully_shard(...)` calls that pass neither mesh= nor **options."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name == "fully_shard" and not any(k.arg in ("mesh", None) for k in node.keywords):
                lines.append(node.lineno)
    return lines


def test_every_fully_shard_names_its_mesh():
    found = {
        str(p.relative_to(PACKAGE.parent)): lines
        for p in sorted(PACKAGE.rglob("*.py"))
        if (lines := calls_without_mesh(p.read_text()))
    }
    assert not found, f"fully_shard without mesh= (it would pick the machine's GPU): {found}"


def test_the_check_finds_a_call_without_mesh():  # negative control
    assert calls_without_mesh("fully_shard(net)\nfully_shard(m, mesh=mesh)\n") == [1]
    assert calls_without_mesh("x.fully_shard(net, reshard_after_forward=True)\n") == [1]
    assert calls_without_mesh("fully_shard(unit, **options)\n") == []
