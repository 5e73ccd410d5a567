"""scripts/zh_docs.py: the Chinese documents (docs/zh/*.md) against their English counterparts.

The course's own documents are in step; then negative controls in a temporary copy: an English
edit makes `check` name the document and show the change, `mark` refuses a stale document whose
Chinese did not change (unless forced), and a damaged or missing record is said in a sentence.
"""

from __future__ import annotations

import shutil

import pytest
import zh
import zh_docs
from conftest import ROOT


def test_the_chinese_documents_are_in_step():
    assert zh_docs.check_docs() == []


@pytest.fixture
def root(tmp_path):
    """A copy of the tracked documents and their records."""
    for name in [*zh_docs.DOCS, *zh_docs.DOCS.values(), zh_docs.RECORDS]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    assert zh_docs.check_docs(tmp_path) == []
    return tmp_path


def test_an_english_edit_is_named_with_what_changed(root):
    readme = root / "README.md"
    readme.write_text(readme.read_text(encoding="utf-8") + "\nA new closing line.\n")
    (found,) = zh_docs.check_docs(root)
    assert found.startswith("docs/zh/README.md: stale, README.md changed")
    assert "\n      +A new closing line." in found


def test_mark_refuses_a_stale_document_whose_chinese_did_not_change(root):
    plan = root / "docs" / "course-plan.md"
    plan.write_text(plan.read_text(encoding="utf-8").replace("instructors", "teachers"))
    chinese = root / "docs" / "zh" / "course-plan.md"
    with pytest.raises(zh.ZhError, match="changed since it was marked, but the Chinese did not"):
        zh_docs.mark_doc(chinese, root=root)
    assert len(zh_docs.check_docs(root)) == 1  # still stale: nothing was written
    chinese.write_text(chinese.read_text(encoding="utf-8") + "\n（已按英文版更新。）\n")
    zh_docs.mark_doc(chinese, root=root)  # the Chinese changed: marked
    assert zh_docs.check_docs(root) == []
    plan.write_text(plan.read_text(encoding="utf-8") + "\n")
    zh_docs.mark_doc(chinese, force=True, root=root)  # an English change that needs none
    assert zh_docs.check_docs(root) == []


def test_a_document_without_a_record_or_untracked_is_said_in_a_sentence(root):
    (root / zh_docs.RECORDS).write_text("{}\n")
    found = zh_docs.check_docs(root)
    assert len(found) == len(zh_docs.DOCS) and all("no record of the" in f for f in found)
    with pytest.raises(zh.ZhError, match="not a tracked Chinese document; these are: docs/zh/"):
        zh_docs.mark_doc(root / "docs" / "zh" / "glossary.md", root=root)


def test_a_damaged_record_file_is_said_in_a_sentence(root):
    (root / zh_docs.RECORDS).write_text("{not json")
    with pytest.raises(zh.ZhError, match="docs/zh/sources.json: not readable JSON"):
        zh_docs.check_docs(root)
