"""Keep the translated notebooks in step with their English sources: the Chinese edition
(notebooks/zh/, solutions/zh/) and any other in EDITIONS (Vietnamese: notebooks/vi/, ...).

    python scripts/zh.py sync [--drop] FILES | --all      # rebuild each from its English source
    python scripts/zh.py check [FILES]                    # exit 1 naming every cell out of step
    python scripts/zh.py mark [--force] FILE [CELL_ID ...] # cells translate today's English text

The English notebook of notebooks/LANG/NN-x.ipynb is notebooks/NN-x.ipynb (solutions alike); the
folder's name is the edition. Sync copies every code cell (source, outputs, execution count,
metadata) and the notebook metadata from the English notebook; a markdown cell keeps its
translated text when the old notebook holds a translation of the same English cell (matched by
the English cell's id), else it gets the English text under the edition's "awaiting translation"
line. Each translated cell records in its metadata which English cell, and which version of its
text, it translates:

    metadata.d2l_gpu.LANG = {"source_id": ID, "source_sha256": SHA-256 of the English source,
                             "source_text": the English source, "zh_sha256": SHA-256 of the
                             translation}

`mark` writes that record after a translation is written or brought up to date; `check` reports
a translation whose English cell changed since (stale), with what changed in the English. `mark`
refuses a stale cell whose translation is the text it marked last time (the English changed, the
translation did not), unless --force says that the English change needs none. `sync` refuses to
drop the translation of an English cell that is gone (deleted, or given a new id), or of a cell
that lost its record, and names it, unless --drop says to. A markdown cell of one edition only
(set-up notes for students in China) carries {"zh_only": true}; sync keeps it after the English
cell it followed. Untranslated cells are allowed only in the notebooks listed in IN_PROGRESS.
The Chinese documents (docs/zh/) are tracked by zh_docs.py, `check` by zh_check.py.
"""

from __future__ import annotations

import copy
import hashlib
import re
import sys
from pathlib import Path

import nbtools

from d2l_gpu._fs import write_atomic

ROOT = Path(__file__).resolve().parent.parent
# Each edition, by the name of its folder (notebooks/NAME/, solutions/NAME/): the line that marks a
# cell awaiting translation, and the hint after it. Everything else is the same for every language.
EDITIONS = {
    "zh": (
        "> **待翻译 (awaiting translation)**：本单元仍是英文原文。",
        "译好后运行 `python scripts/zh.py mark {file} {id}`。\n\n",
    ),
    "vi": (
        "> **Chờ dịch (awaiting translation)**: ô này vẫn là nguyên văn tiếng Anh.",
        " Dịch xong, hãy chạy `python scripts/zh.py mark {file} {id}`.\n\n",
    ),
}
# Translated notebooks whose translation is under way: cells awaiting translation are allowed here.
IN_PROGRESS: set[str] = set()
PENDING_MARK, PENDING_HINT = EDITIONS["zh"]
_LINK_UP_RE = re.compile(r"(\]\(\s*<?|\ssrc=\")\.\./")


class ZhError(ValueError):
    """A translated notebook that cannot be synced or marked: the message says which and why."""


def edition(path) -> str:
    """The edition (zh, vi) that the translated notebook or folder `path` belongs to."""
    lang = Path(path).parent.name
    if lang not in EDITIONS:
        raise ZhError(
            f"{path}: not in a folder of an edition; translated notebooks live in "
            + ", ".join(f"notebooks/{e}/ and solutions/{e}/" for e in EDITIONS)
        )
    return lang


def awaits(text: str) -> bool:
    """True for a cell's text that still starts with an edition's awaiting-translation line."""
    return any(text.startswith(mark) for mark, _ in EDITIONS.values())


def source(cell) -> str:
    """A cell's source as one string."""
    return nbtools._source(cell)


def sha256(text: str) -> str:
    """The hex SHA-256 of `text` (UTF-8)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def record(cell, lang: str = "zh") -> dict:
    """The cell's `d2l_gpu.LANG` record (the edition's), or {} where it has none."""
    rec = cell.get("metadata", {}).get("d2l_gpu", {})
    found = rec.get(lang) if isinstance(rec, dict) else None
    return found if isinstance(found, dict) else {}


def rel(path) -> str:
    """`path` as it is written in IN_PROGRESS and in messages: notebooks/zh/NN-x.ipynb."""
    return "/".join(Path(path).resolve().parts[-3:])


def english_path(zh_path) -> Path:
    """The English notebook that the translated notebook `zh_path` translates."""
    zh_path = Path(zh_path)
    edition(zh_path)
    return zh_path.parent.parent / zh_path.name


def all_zh_files(root=ROOT, lang: str = "zh") -> list[Path]:
    """Every notebook of the edition `lang` (Chinese by default)."""
    dirs = (Path(root) / "notebooks" / lang, Path(root) / "solutions" / lang)
    return sorted(p for d in dirs for p in d.glob("*.ipynb"))


def all_translated(root=ROOT) -> list[Path]:
    """Every translated notebook of every edition."""
    return [p for lang in EDITIONS for p in all_zh_files(root, lang)]


def _load(path, what: str) -> dict:
    """The notebook JSON at `path`, or ZhError naming the file and what to do."""
    try:
        nb = nbtools.load(path)
    except (OSError, ValueError) as e:
        raise ZhError(f"{path}: cannot read the {what} notebook ({e})") from None
    shape = nbtools.shape_problems(nb)
    if shape:
        raise ZhError(f"{path}: the {what} notebook is not a notebook in shape: {shape[0]}")
    return nb


def _zh_meta(cell, rec: dict, lang: str = "zh") -> None:
    """Set the cell's `d2l_gpu.LANG` record to `rec`."""
    cell.setdefault("metadata", {}).setdefault("d2l_gpu", {})[lang] = rec


def _deeper_links(text: str) -> str:
    """English markdown with its ../ links made one folder deeper, as zh/ needs them."""
    return _LINK_UP_RE.sub(lambda m: m.group(1) + "../../", text)


def pending_text(en_cell, zh_path) -> str:
    """The text of a cell awaiting translation: the marker, then the English text."""
    mark, hint = EDITIONS[edition(zh_path)]
    hint = hint.format(file=rel(zh_path), id=en_cell["id"])
    return f"{mark}{hint}{_deeper_links(source(en_cell))}"


def is_pending(cell, lang: str = "zh") -> bool:
    """True for a cell that still awaits translation (or awaits `mark`)."""
    return bool(record(cell, lang).get("pending"))


def dropped(en: dict, old: dict | None, lang: str = "zh") -> list[str]:
    """The translations in `old` that a rebuild from `en` would lose, each said with its cell:
    one whose English cell is gone, and a translated cell that has lost its record (a tool that
    rewrote the notebook without the records), which a rebuild would take for untranslated."""
    en_cells = {c["id"]: c for c in en["cells"]}
    lost = []
    for cell in old["cells"] if old else []:
        rec, text = record(cell, lang), source(cell)
        if rec.get("zh_only") or rec.get("pending") or cell.get("cell_type") == "code":
            continue
        if rec.get("source_id") not in (None, *en_cells):
            first = nbtools.first_line(cell)
            lost.append(f"{rec['source_id']} ({first!r}): its English cell is gone")
        elif not rec and cell.get("id") in en_cells and not awaits(text):
            if text != _deeper_links(source(en_cells[cell["id"]])):  # a translation, unrecorded
                lost.append(
                    f"{cell['id']} ({nbtools.first_line(cell)!r}): it has no record (restore the "
                    "notebook from git, or run mark on the cell if its translation is current)"
                )
    return lost


def build(en: dict, old: dict | None, zh_path) -> dict:
    """The Chinese notebook rebuilt from English `en`, keeping the translations in `old`."""
    lang = edition(zh_path)
    en_ids = {c["id"] for c in en["cells"]}
    kept, extras, anchor = {}, {}, None  # extras: zh_only cells by the English id they follow
    for cell in old["cells"] if old else []:
        rec = record(cell, lang)
        if rec.get("zh_only"):
            extras.setdefault(anchor, []).append(cell)
        elif rec.get("source_id") in en_ids:
            kept[rec["source_id"]] = cell
            anchor = rec["source_id"]
        elif cell.get("id") in en_ids:
            anchor = cell["id"]
    cells = list(extras.pop(None, []))
    for en_cell in en["cells"]:
        new = copy.deepcopy(en_cell)
        if en_cell["cell_type"] != "code":
            old_cell = kept.get(en_cell["id"])
            rec = dict(record(old_cell, lang)) if old_cell else {}
            if old_cell is None or rec.get("pending") and awaits(source(old_cell)):
                new["source"] = pending_text(en_cell, zh_path)
                rec = {"source_id": en_cell["id"], "pending": True}
            else:  # a translation, or an edited cell awaiting `mark`: its text is kept
                new["source"] = source(old_cell)
                if old_cell.get("attachments"):
                    new["attachments"] = copy.deepcopy(old_cell["attachments"])
            _zh_meta(new, rec, lang)
        cells.append(new)
        cells += extras.pop(en_cell["id"], [])
    for orphans in extras.values():  # the English cell they followed is gone: keep them last
        cells += orphans
    nb = copy.deepcopy(en)
    nb["cells"] = cells
    return nb


def render(nb: dict) -> str:
    """The notebook's text in the normal form of scripts/nbtools.py, with the zh records kept."""
    records = [copy.deepcopy(c.get("metadata", {}).get("d2l_gpu")) for c in nb["cells"]]
    tidied = nbtools.tidy(nb)
    for cell, rec in zip(tidied["cells"], records, strict=True):
        if rec is not None:
            cell["metadata"]["d2l_gpu"] = rec
    return nbtools.dumps(tidied)


def sync_file(zh_path, drop: bool = False) -> bool:
    """Rebuild the Chinese notebook `zh_path` from its English source; True if it changed. A
    translation whose English cell is gone is dropped only with `drop`; else ZhError names it."""
    zh_path = Path(zh_path)
    en_path = english_path(zh_path)
    if not en_path.exists():
        raise ZhError(
            f"{zh_path}: no English notebook {en_path}; remove the Chinese one or fix its name"
        )
    en = _load(en_path, "English")
    old = _load(zh_path, "Chinese") if zh_path.exists() else None
    lost = dropped(en, old, edition(zh_path))
    if lost and not drop:
        raise ZhError(
            f"{zh_path}: sync would drop {len(lost)} translation(s): {'; '.join(lost)}. Where an "
            "English cell only got a new id, give its translation the new id (cell id and "
            "source_id) and sync again; to drop them, run sync --drop"
        )
    new = render(build(en, old, zh_path))
    if zh_path.exists() and zh_path.read_text(encoding="utf-8") == new:
        return False
    zh_path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(zh_path, new)
    return True


def marked(old: dict, english: str, chinese: str, force: bool, what: str) -> dict:
    """The record of a translation `chinese` of `english`, marked today. Refused (ZhError, the
    sentence begins with `what`) where the English changed since the `old` record but the
    Chinese did not, unless `force` says that the English change needs none."""
    stale = old.get("source_sha256") not in (None, sha256(english))
    if stale and old.get("zh_sha256") == sha256(chinese) and not force:
        raise ZhError(
            f"{what} changed since it was marked, but the Chinese did not (python scripts/zh.py "
            "check shows what changed): update it, or mark --force if the English change needs "
            "none"
        )
    return {"source_sha256": sha256(english), "source_text": english, "zh_sha256": sha256(chinese)}


def mark_file(zh_path, ids: list[str], force: bool = False) -> list[str]:
    """Record that cells `ids` translate today's English (no ids: edited cells awaiting mark).
    A stale cell whose Chinese did not change since its last mark is refused unless `force`."""
    zh_path = Path(zh_path)
    lang = edition(zh_path)
    en = {c["id"]: c for c in _load(english_path(zh_path), "English")["cells"]}
    nb = _load(zh_path, "Chinese")
    by_id = {c.get("id"): c for c in nb["cells"]}
    if not ids:
        ids = [c["id"] for c in nb["cells"] if is_pending(c, lang) and not awaits(source(c))]
    for cell_id in ids:
        cell = by_id.get(cell_id)
        if cell is None or cell_id not in en or cell.get("cell_type") == "code":
            raise ZhError(
                f"{zh_path}: no markdown cell {cell_id!r} that translates an English cell"
            )
        if awaits(source(cell)):
            raise ZhError(
                f"{zh_path}: cell {cell_id} still holds the English text under the "
                "awaiting-translation line; translate it (and delete that line) before marking it"
            )
        rec = marked(record(cell, lang), source(en[cell_id]), source(cell), force,
                     f"{zh_path}: cell {cell_id}: its English")  # fmt: skip
        _zh_meta(cell, {"source_id": cell_id, **rec}, lang)
    text = render(nb)
    if text != zh_path.read_text(encoding="utf-8"):
        write_atomic(zh_path, text)
    return ids


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("sync", "check", "mark"):
        print(__doc__)
        return 2
    cmd, args = argv[0], argv[1:]
    flag = {"sync": "--drop", "mark": "--force"}.get(cmd)
    forced = flag in args
    args = [a for a in args if a != flag]
    if cmd == "mark":
        if not args:
            print("mark needs a Chinese notebook: python scripts/zh.py mark FILE [CELL_ID ...]")
            return 2
        import zh_docs  # the Chinese documents (docs/zh/*.md): one record per document

        try:
            if args[0].endswith(".md"):
                zh_docs.mark_doc(args[0], force=forced)
                print(f"{args[0]}: marked as in step with {zh_docs.DOCS[zh_docs.rel_doc(args[0])]}")
                return 0
            done = mark_file(args[0], args[1:], force=forced)
        except ZhError as e:
            print(f"not marked: {e}")
            return 1
        print(f"{args[0]}: marked {len(done)} cell(s) as translating today's English text")
        return 0
    import zh_check  # what `check` looks at

    files = all_translated() if cmd == "check" and not args or args == ["--all"] else args
    if not files:
        print("sync needs files, or --all for every notebook under notebooks/zh and solutions/zh")
        return 2
    bad = 0
    for f in files:
        if cmd == "sync":
            try:
                print(f"{'synced' if sync_file(f, drop=forced) else 'unchanged'}: {f}")
            except (ZhError, OSError) as e:
                bad += 1
                print(f"not synced: {e}")
            continue
        found = zh_check.check_file(f)
        bad += bool(found)
        for p in found:
            print(f"{rel(f)}: {p}")
        if not found and rel(f) in IN_PROGRESS:
            print(f"{rel(f)}: in progress (IN_PROGRESS): untranslated cells allowed")
    if cmd == "check":
        print(f"{len(files) - bad}/{len(files)} translated notebooks in step with their English")
    if cmd == "check" and not args:
        import zh_docs

        try:
            found = zh_docs.check_docs()
        except ZhError as e:
            found = [str(e)]
        print(*found, sep="\n") if found else print("the Chinese documents are in step too")
        bad += bool(found)
    return 1 if bad else 0


if __name__ == "__main__":
    import zh  # this file again, as the module zh_check and zh_docs import: one ZhError for all

    sys.exit(zh.main())
