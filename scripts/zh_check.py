"""Whether a Chinese notebook is in step with its English source (`python scripts/zh.py check`):
every cell there, in order, code and outputs identical, each translation's record current (a stale
one shown with the English lines that changed), images that resolve, the form `sync` writes.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import nbtools
import zh as tool
from zh import ZhError, _load, build, edition, english_path, record, rel, render, sha256, source

IMAGE_RE = re.compile(
    r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|<img[^>]*\ssrc=\"([^\"]+)\""
)


def english_diff(before: str | None, now: str, most: int = 12) -> str:
    """What changed in an English cell since its translation was marked, as indented diff
    lines (at most `most`), or "" where the record keeps no text."""
    if before is None:
        return ""
    lines = list(difflib.unified_diff(before.splitlines(), now.splitlines(), lineterm="", n=0))
    lines = [ln for ln in lines[2:] if not ln.startswith("@@")]  # the +/- lines only
    more = [f"... {len(lines) - most} more line(s)"] if len(lines) > most else []
    return "".join(f"\n      {ln}" for ln in [*lines[:most], *more])


def _where(i: int, cell) -> str:
    return f"cell {i} (id {cell.get('id')}, {nbtools.first_line(cell)!r})"


def image_problems(nb: dict, folder: Path) -> list[str]:
    """Each markdown image link of `nb` that is relative and names no file under `folder`."""
    out = []
    for i, cell in enumerate(nb["cells"]):
        if cell.get("cell_type") != "markdown":
            continue
        for m in IMAGE_RE.finditer(source(cell)):
            link = (m.group(1) or m.group(2)).split("#")[0]
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^/", link) or not link:
                continue  # a URL (http:, data:, attachment:) or an absolute path
            if not (folder / link).is_file():
                out.append(
                    f"{_where(i, cell)}: image link {link} names no file; "
                    "from zh/ it is ../../img/NAME"
                )
    return out


def check_file(zh_path, in_progress: set[str] | None = None) -> list[str]:
    """Every way the translated notebook `zh_path` is out of step with its English source."""
    zh_path = Path(zh_path)
    in_progress = tool.IN_PROGRESS if in_progress is None else in_progress
    try:
        lang = edition(zh_path)
        en_path = english_path(zh_path)
        en = _load(en_path, "English")
        zh = _load(zh_path, "translated")
    except ZhError as e:
        return [str(e).removeprefix(f"{zh_path}: ")]
    out = []
    en_cells = {c.get("id"): (i, c) for i, c in enumerate(en["cells"])}
    zh_cells, seen = [], []
    for i, cell in enumerate(zh["cells"]):
        if record(cell, lang).get("zh_only"):
            if cell.get("cell_type") != "markdown":
                out.append(f"{_where(i, cell)}: a Chinese-only cell must be markdown, not code")
            continue
        if cell.get("id") not in en_cells:
            out.append(
                f"{_where(i, cell)}: extra cell, no English cell has its id; run sync (with "
                "--drop if its English cell is gone for good)"
            )
            continue
        zh_cells.append((i, cell))
        seen.append(cell["id"])
    for cell_id, (j, en_cell) in en_cells.items():
        if cell_id not in seen:
            out.append(
                f"English cell {j} (id {cell_id}, {nbtools.first_line(en_cell)!r}) is missing; "
                "run sync"
            )
    if seen != [c for c in en_cells if c in seen]:
        out.append("cells are not in the English order; run sync")
    if zh.get("metadata") != en.get("metadata"):
        out.append("notebook metadata (the execution record) differs from the English; run sync")
    allowed = rel(zh_path) in in_progress
    pending = []
    for i, cell in zh_cells:
        en_cell = en_cells[cell["id"]][1]
        where = _where(i, cell)
        if en_cell.get("cell_type") == "code" or cell.get("cell_type") == "code":
            for key in ("cell_type", "source", "outputs", "execution_count", "metadata"):
                if key == "source" and source(cell) == source(en_cell):
                    continue
                if cell.get(key) != en_cell.get(key):
                    out.append(
                        f"{where}: code cell's {key} differs from the English cell; run sync"
                    )
            continue
        rec = record(cell, lang)
        if cell.get("cell_type") != en_cell.get("cell_type"):
            out.append(
                f"{where}: {cell.get('cell_type')} cell for a "
                f"{en_cell.get('cell_type')} cell; run sync"
            )
        if rec.get("source_id") != cell["id"]:
            out.append(f"{where}: no record of the English cell it translates; run sync, then mark")
        elif rec.get("pending"):
            pending.append(cell["id"])
        elif rec.get("source_sha256") != sha256(source(en_cell)):
            out.append(
                f"{where}: stale, English cell {cell['id']} changed after it was translated; "
                f"update the Chinese, then: python scripts/zh.py mark {rel(zh_path)} {cell['id']}"
                + english_diff(rec.get("source_text"), source(en_cell))
            )
    if pending and not allowed:
        out.append(
            f"{len(pending)} cell(s) await translation ({', '.join(pending)}), and the notebook "
            "is not listed in IN_PROGRESS in scripts/zh.py: translate them and run mark"
        )
    out += image_problems(zh, zh_path.parent)
    if not out:
        try:
            if render(build(en, zh, zh_path)) != zh_path.read_text(encoding="utf-8"):
                out.append(
                    "not in the form sync writes; run: python scripts/zh.py sync " + rel(zh_path)
                )
        except Exception as e:  # noqa: BLE001 - a shape no check foresaw: report it
            out.append(f"cannot be rebuilt ({type(e).__name__}: {e})")
    return out
