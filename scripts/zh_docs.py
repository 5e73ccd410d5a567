"""The Chinese documents (docs/zh/*.md) against their English counterparts, as zh.py does for
the notebooks: `python scripts/zh.py check` reports a Chinese document whose English changed since
it was last brought into step, with what changed; `python scripts/zh.py mark docs/zh/NAME.md`
records that it is in step again.

A Chinese document is not a sentence-by-sentence translation (the Chinese README adds set-up
for students in China), so the record is per document: the English text it was last reviewed
against, and the Chinese text it had then (docs/zh/sources.json). The glossary has no English
counterpart and is not tracked.
"""

from __future__ import annotations

import json
from pathlib import Path

from zh import ZhError, marked, sha256
from zh_check import english_diff

from d2l_gpu._fs import write_atomic

ROOT = Path(__file__).resolve().parent.parent
# each Chinese document, and the English one it follows (paths from the repository's root)
DOCS = {
    "docs/zh/README.md": "README.md",
    "docs/zh/course-plan.md": "docs/course-plan.md",
    "docs/zh/grading.md": "docs/grading.md",
}
RECORDS = "docs/zh/sources.json"


def _read(root: Path, name: str) -> str:
    try:
        return (root / name).read_text(encoding="utf-8")
    except OSError as e:
        raise ZhError(f"{name}: cannot be read ({e.strerror or e})") from None


def records(root: Path = ROOT) -> dict[str, dict]:
    """The records of RECORDS: Chinese document -> what it was last brought into step with."""
    path = root / RECORDS
    if not path.exists():
        return {}
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ZhError(f"{RECORDS}: not readable JSON ({e}); restore it from git") from None
    if not isinstance(found, dict):
        raise ZhError(f"{RECORDS}: not a JSON object of records; restore it from git")
    return found


def check_docs(root: Path = ROOT) -> list[str]:
    """Each Chinese document out of step with its English one, in a sentence with the diff."""
    out, recs = [], records(root)
    for zh_doc, en_doc in DOCS.items():
        rec, english = recs.get(zh_doc, {}), _read(root, en_doc)
        _read(root, zh_doc)  # it must exist
        if rec.get("source_sha256") is None:
            out.append(
                f"{zh_doc}: no record of the {en_doc} it follows; bring it into step, then: "
                f"python scripts/zh.py mark {zh_doc}"
            )
        elif rec["source_sha256"] != sha256(english):
            out.append(
                f"{zh_doc}: stale, {en_doc} changed after it was brought into step; update the "
                f"Chinese, then: python scripts/zh.py mark {zh_doc}"
                + english_diff(rec.get("source_text"), english, most=20)
            )
    return out


def rel_doc(path: str | Path, root: Path = ROOT) -> str:
    """`path` as DOCS names it (from the repository's root), or as given if outside it."""
    try:
        return Path(path).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def mark_doc(zh_doc: str | Path, force: bool = False, root: Path = ROOT) -> None:
    """Record that `zh_doc` is in step with today's English. A stale document whose Chinese is
    the text marked last time is refused unless `force` (the English change needs none)."""
    zh_doc = rel_doc(zh_doc, root)
    if zh_doc not in DOCS:
        raise ZhError(f"{zh_doc}: not a tracked Chinese document; these are: {', '.join(DOCS)}")
    recs = records(root)
    english, chinese = _read(root, DOCS[zh_doc]), _read(root, zh_doc)
    rec = marked(recs.get(zh_doc, {}), english, chinese, force, f"{zh_doc}: {DOCS[zh_doc]}")
    recs[zh_doc] = {"source": DOCS[zh_doc], **rec}
    text = json.dumps(dict(sorted(recs.items())), indent=1, ensure_ascii=False) + "\n"
    write_atomic(root / RECORDS, text)
