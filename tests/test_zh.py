"""The Chinese edition (notebooks/zh/, solutions/zh/) against the English, via scripts/zh.py.

Every Chinese notebook: code cells, outputs, execution counts and notebook metadata identical to
the English notebook (checked here directly, not only through the tool), every English cell
present, no stale translation, image links that resolve. Then negative controls on temporary
copies: each way of falling out of step makes `check` fail and name the cell.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import nbtools
import pytest
import zh
import zh_check
from conftest import ROOT

ZH_FILES = zh.all_zh_files()
ALL = zh.all_translated()  # every edition's notebooks: Chinese, and Vietnamese as they come
IDS = [zh.rel(p) for p in ALL]


def code_cells(nb) -> list[tuple]:
    """(id, source, outputs, execution count, metadata) of each code cell, in order."""
    return [
        (c["id"], zh.source(c), c["outputs"], c["execution_count"], c["metadata"])
        for c in nb["cells"]
        if c["cell_type"] == "code"
    ]


def test_there_is_a_chinese_edition():
    assert any(p.parent.parent.name == "notebooks" for p in ZH_FILES), "no notebooks/zh/*.ipynb"


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_code_and_outputs_identical_to_english(path):
    en, nb = nbtools.load(zh.english_path(path)), nbtools.load(path)
    assert code_cells(nb) == code_cells(en)
    assert nb["metadata"] == en["metadata"]  # the same execution record


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_in_step_with_english(path):
    assert zh_check.check_file(path) == []


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_every_markdown_cell_records_its_english_cell(path):
    en = {c["id"]: c for c in nbtools.load(zh.english_path(path))["cells"]}
    for cell in nbtools.load(path)["cells"]:
        rec = zh.record(cell, zh.edition(path))
        if cell["cell_type"] == "code" or rec.get("zh_only"):
            continue
        assert rec["source_id"] == cell["id"] in en
        if zh.rel(path) not in zh.IN_PROGRESS:
            assert not rec.get("pending"), f"{cell['id']} awaits translation"
            assert rec["source_sha256"] == zh.sha256(zh.source(en[cell["id"]])), cell["id"]
            assert rec["source_text"] == zh.source(en[cell["id"]]), cell["id"]  # for the diff


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_sync_changes_nothing(path, tmp_path):
    copied = copy_pair(path, tmp_path)
    assert zh.sync_file(copied) is False


def test_chinese_solutions_named_in_the_chinese_notebooks_exist():
    """A lesson's "参考解答在 `solutions/zh/NN-x.ipynb`" names a file that is there."""
    for path in ZH_FILES:
        for cell in nbtools.load(path)["cells"]:
            if cell["cell_type"] == "markdown":
                for name in re.findall(r"solutions/zh/[\w.-]+\.ipynb", zh.source(cell)):
                    assert (ROOT / name).is_file(), f"{zh.rel(path)} cell {cell['id']}: {name}"


def test_nbtools_reads_the_chinese_notebooks_as_valid_notebooks():
    for path in ZH_FILES:
        problems = [p for p in nbtools.check_file(path) if "stray metadata" not in p]
        assert problems == [], path  # stray: the d2l_gpu.zh record, which nbtools does not know


# --- negative controls on temporary copies ------------------------------------------------------


def copy_pair(zh_path, tmp_path):
    """Copy a translated notebook, its English source and the images into tmp_path, same layout."""
    kind, lang = zh_path.parent.parent.name, zh.edition(zh_path)
    (tmp_path / kind / lang).mkdir(parents=True, exist_ok=True)
    shutil.copy(zh.english_path(zh_path), tmp_path / kind / zh_path.name)
    shutil.copy(zh_path, tmp_path / kind / lang / zh_path.name)
    if not (tmp_path / "img").exists():
        shutil.copytree(ROOT / "img", tmp_path / "img")
    return tmp_path / kind / lang / zh_path.name


def english_notebook() -> dict:
    """A small English lesson: a title with an image, code with output, prose, code."""

    def md(cid, text):
        return {"cell_type": "markdown", "id": cid, "metadata": {}, "source": text}

    def code(cid, text, out, n):
        stream = {"output_type": "stream", "name": "stdout", "text": out}
        return {
            "cell_type": "code",
            "id": cid,
            "metadata": {},
            "source": text,
            "execution_count": n,
            "outputs": [stream],
        }

    nb = {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {"language_info": {"name": "python"}},
        "cells": [
            md("title", "# 1. Devices\n\n![Devices](../img/devices.svg)"),
            code("code1", "print(1 + 1)", "2\n", 1),
            md("prose", "The CPU is **one** device."),
            code("code2", "print('cpu')", "cpu\n", 2),
        ],
    }
    return json.loads(nbtools.dumps(nbtools.tidy(nb)))


CHINESE = {"title": "# 1. 设备\n\n![设备](../../img/devices.svg)", "prose": "CPU 是**一个**设备。"}


def synced(tmp_path, lang: str = "zh"):
    """(English path, path of edition `lang`) of the small lesson, synced, not yet translated."""
    shutil.copytree(ROOT / "img", tmp_path / "img")
    (tmp_path / "notebooks" / lang).mkdir(parents=True)
    en_path = tmp_path / "notebooks" / "00-sample.ipynb"
    en_path.write_text(nbtools.dumps(english_notebook()), encoding="utf-8")
    path = tmp_path / "notebooks" / lang / "00-sample.ipynb"
    assert zh.sync_file(path) is True
    return en_path, path


@pytest.fixture
def pair(tmp_path):
    """(English path, Chinese path) of a synced and fully translated small lesson."""
    en_path, zh_path = synced(tmp_path)
    translate(zh_path, CHINESE)
    assert zh_check.check_file(zh_path) == []
    return en_path, zh_path


def translate(zh_path, texts: dict) -> None:
    """Replace the text of cells by id, as a translator would, then run mark on them."""
    edit(
        zh_path,
        lambda nb: [c.update(source=texts[c["id"]]) for c in nb["cells"] if c["id"] in texts],
    )
    assert zh.mark_file(zh_path, list(texts)) == list(texts)


def edit(path, change) -> None:
    nb = nbtools.load(path)
    change(nb)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def cell(nb, cell_id):
    return next(c for c in nb["cells"] if c["id"] == cell_id)


def test_sync_of_a_new_notebook_marks_every_markdown_cell_as_awaiting(tmp_path):
    shutil.copytree(ROOT / "img", tmp_path / "img")
    (tmp_path / "notebooks" / "zh").mkdir(parents=True)
    (tmp_path / "notebooks" / "00-sample.ipynb").write_text(nbtools.dumps(english_notebook()))
    zh_path = tmp_path / "notebooks" / "zh" / "00-sample.ipynb"
    zh.sync_file(zh_path)
    nb = nbtools.load(zh_path)
    title = cell(nb, "title")
    assert zh.source(title).startswith(zh.PENDING_MARK)
    assert "](../../img/devices.svg)" in zh.source(title)  # one folder deeper, so it resolves
    found = zh_check.check_file(zh_path, in_progress=set())
    assert len(found) == 1 and "await translation (title, prose)" in found[0]
    assert "IN_PROGRESS" in found[0]
    assert zh_check.check_file(zh_path, in_progress={"notebooks/zh/00-sample.ipynb"}) == []
    with pytest.raises(zh.ZhError, match="still holds the English text"):
        zh.mark_file(zh_path, ["title"])


def test_editing_an_english_markdown_cell_alone_makes_the_translation_stale(pair):
    en_path, zh_path = pair
    edit(
        en_path,
        lambda nb: cell(nb, "prose").update(source="The CPU is one device, however many cores."),
    )
    found = zh_check.check_file(zh_path)
    assert len(found) == 1 and "id prose" in found[0] and "stale" in found[0]
    assert zh.sync_file(zh_path) is False  # sync keeps the translation, and it stays stale
    assert zh_check.check_file(zh_path) == found
    translate(zh_path, {"prose": "无论有多少个核，CPU 都是一个设备。"})
    assert zh_check.check_file(zh_path) == []


def test_a_stale_cell_is_shown_with_what_changed_in_the_english(pair):
    en_path, zh_path = pair
    edit(en_path, lambda nb: cell(nb, "prose").update(source="The CPU is one device, always."))
    (found,) = zh_check.check_file(zh_path)
    assert "\n      -The CPU is **one** device." in found
    assert "\n      +The CPU is one device, always." in found


def test_mark_refuses_a_stale_cell_whose_chinese_did_not_change(pair):
    en_path, zh_path = pair
    edit(en_path, lambda nb: cell(nb, "prose").update(source="The CPU is one device, always."))
    with pytest.raises(
        zh.ZhError, match="cell prose: its English changed .* but the Chinese did not"
    ):
        zh.mark_file(zh_path, ["prose"])
    assert len(zh_check.check_file(zh_path)) == 1  # still stale: nothing was written
    assert zh.main(["mark", "--force", str(zh_path), "prose"]) == 0  # the English change needs none
    assert zh_check.check_file(zh_path) == []
    assert zh.mark_file(zh_path, ["prose"]) == ["prose"]  # in step: marking again is harmless


def test_sync_refuses_to_drop_a_translation_whose_english_cell_is_gone(pair, capsys):
    en_path, zh_path = pair
    before = zh_path.read_text(encoding="utf-8")
    edit(en_path, lambda nb: cell(nb, "prose").update(id="prose-2"))  # a new id, as an editor may
    with pytest.raises(zh.ZhError, match=r"drop 1 translation\(s\).*: prose \('CPU 是"):
        zh.sync_file(zh_path)
    assert zh_path.read_text(encoding="utf-8") == before  # nothing lost
    assert zh.main(["sync", str(zh_path)]) == 1 and "sync --drop" in capsys.readouterr().out
    assert zh.main(["sync", "--drop", str(zh_path)]) == 0
    assert zh.is_pending(cell(nbtools.load(zh_path), "prose-2"))


def test_tidying_a_chinese_notebook_keeps_its_records(tmp_path):
    path = copy_pair(ZH_FILES[0], tmp_path)
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "nbtools.py"), "tidy", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert zh_check.check_file(path) == [] and zh.sync_file(path) is False


def test_sync_refuses_to_take_translations_that_lost_their_records_for_untranslated(pair):
    _, zh_path = pair
    edit(zh_path, lambda nb: [c["metadata"].pop("d2l_gpu", None) for c in nb["cells"]])
    before = zh_path.read_text(encoding="utf-8")
    with pytest.raises(zh.ZhError, match=r"drop 2 translation\(s\): title .* it has no record"):
        zh.sync_file(zh_path)
    assert zh_path.read_text(encoding="utf-8") == before  # nothing lost


def test_the_vietnamese_edition_is_kept_in_step_by_the_same_tool(tmp_path):
    en_path, vi_path = synced(tmp_path, "vi")
    title = cell(nbtools.load(vi_path), "title")
    assert zh.source(title).startswith(zh.EDITIONS["vi"][0])  # its own awaiting-translation line
    assert zh.record(title, "vi")["pending"] and zh.record(title, "zh") == {}
    translate(vi_path, {"title": "# 1. Thiết bị\n\n![Thiết bị](../../img/devices.svg)",
                        "prose": "CPU là **một** thiết bị."})  # fmt: skip
    assert zh_check.check_file(vi_path) == []
    edit(en_path, lambda nb: cell(nb, "prose").update(source="The CPU is one device, always."))
    (found,) = zh_check.check_file(vi_path)  # an English-only edit: the Vietnamese is stale
    assert "id prose" in found and "stale" in found and "+The CPU is one device, always." in found
    with pytest.raises(zh.ZhError, match="not in a folder of an edition"):
        zh.english_path(tmp_path / "notebooks" / "fr" / "00-sample.ipynb")


def test_editing_a_code_cell_in_the_chinese_copy_fails(pair):
    _, zh_path = pair
    edit(zh_path, lambda nb: cell(nb, "code1").update(source="print(1 + 2)"))
    found = zh_check.check_file(zh_path)
    assert any("id code1" in p and "source differs" in p for p in found), found
    zh.sync_file(zh_path)
    assert zh_check.check_file(zh_path) == []


def test_changing_an_output_in_the_chinese_copy_fails(pair):
    _, zh_path = pair
    edit(zh_path, lambda nb: cell(nb, "code2")["outputs"][0].update(text=["中央处理器\n"]))
    found = zh_check.check_file(zh_path)
    assert any("id code2" in p and "outputs differs" in p for p in found), found


def test_a_changed_english_code_cell_fails_until_sync_copies_it(pair):
    en_path, zh_path = pair
    edit(en_path, lambda nb: cell(nb, "code2")["outputs"][0].update(text=["CPU\n"]))
    assert any("id code2" in p for p in zh_check.check_file(zh_path))
    assert zh.sync_file(zh_path) is True
    assert zh_check.check_file(zh_path) == []
    assert zh.source(cell(nbtools.load(zh_path), "prose")) == CHINESE["prose"]


@pytest.mark.parametrize("cell_id", ["code1", "prose"])
def test_a_missing_cell_fails(pair, cell_id):
    _, zh_path = pair
    edit(zh_path, lambda nb: nb["cells"].remove(cell(nb, cell_id)))
    found = zh_check.check_file(zh_path)
    assert any(f"id {cell_id}" in p and "missing" in p for p in found), found


def test_an_extra_cell_fails(pair):
    _, zh_path = pair
    extra = {"cell_type": "markdown", "id": "extra", "metadata": {}, "source": "多出来的一段"}
    edit(zh_path, lambda nb: nb["cells"].insert(2, extra))
    assert any("id extra" in p and "extra cell" in p for p in zh_check.check_file(zh_path))


def test_cells_out_of_order_fail(pair):
    _, zh_path = pair
    edit(zh_path, lambda nb: nb["cells"].reverse())
    assert any("order" in p for p in zh_check.check_file(zh_path))


def test_a_chinese_only_cell_is_allowed_and_kept_by_sync(pair):
    en_path, zh_path = pair
    note = {
        "cell_type": "markdown",
        "id": "zh-setup",
        "metadata": {"d2l_gpu": {"zh": {"zh_only": True}}},
        "source": "**国内学生注意：** 先确认装的是 CUDA 版的 PyTorch。",
    }
    edit(zh_path, lambda nb: nb["cells"].insert(2, note))
    zh.sync_file(zh_path)
    assert zh_check.check_file(zh_path) == []
    edit(en_path, lambda nb: cell(nb, "code1")["outputs"][0].update(text=["two\n"]))
    zh.sync_file(zh_path)
    assert zh_check.check_file(zh_path) == []
    ids = [c["id"] for c in nbtools.load(zh_path)["cells"]]
    assert ids == ["title", "code1", "zh-setup", "prose", "code2"]
    en, nb = nbtools.load(en_path), nbtools.load(zh_path)
    assert code_cells(nb) == code_cells(en)


def test_a_chinese_only_code_cell_fails(pair):
    _, zh_path = pair
    extra = {
        "cell_type": "code",
        "id": "zh-code",
        "metadata": {"d2l_gpu": {"zh": {"zh_only": True}}},
        "source": "print('你好')",
        "execution_count": None,
        "outputs": [],
    }
    edit(zh_path, lambda nb: nb["cells"].append(extra))
    assert any("id zh-code" in p and "must be markdown" in p for p in zh_check.check_file(zh_path))


def test_an_image_link_that_names_no_file_fails(pair):
    _, zh_path = pair
    wrong = "# 1. 设备\n\n![设备](../img/devices.svg)"  # the English link, one folder too shallow
    edit(zh_path, lambda nb: cell(nb, "title").update(source=wrong))
    zh.mark_file(zh_path, ["title"])
    found = zh_check.check_file(zh_path)
    assert len(found) == 1 and "id title" in found[0] and "../img/devices.svg" in found[0]


def test_a_translation_without_its_record_fails(pair):
    _, zh_path = pair
    edit(zh_path, lambda nb: cell(nb, "prose")["metadata"].pop("d2l_gpu"))
    assert any("id prose" in p and "no record" in p for p in zh_check.check_file(zh_path))


def test_the_command_line_names_the_file_and_exits_1(pair):
    en_path, zh_path = pair
    edit(en_path, lambda nb: cell(nb, "prose").update(source="changed"))
    script = ROOT / "scripts" / "zh.py"
    run = subprocess.run(
        [sys.executable, str(script), "check", str(zh_path)], capture_output=True, text=True
    )
    assert run.returncode == 1
    assert "notebooks/zh/00-sample.ipynb" in run.stdout and "id prose" in run.stdout
    edit(en_path, lambda nb: cell(nb, "prose").update(source="The CPU is **one** device."))
    run = subprocess.run(
        [sys.executable, str(script), "check", str(zh_path)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout


def test_sync_refuses_a_chinese_notebook_without_english_source(tmp_path):
    (tmp_path / "notebooks" / "zh").mkdir(parents=True)
    with pytest.raises(zh.ZhError, match="no English notebook"):
        zh.sync_file(tmp_path / "notebooks" / "zh" / "99-nothing.ipynb")


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_real_notebook_editing_one_english_markdown_cell_alone_fails(path, tmp_path):
    copied = copy_pair(path, tmp_path)
    en_path = zh.english_path(copied)
    nb = nbtools.load(copied)
    translated = [
        c["id"]
        for c in nb["cells"]
        if c["cell_type"] == "markdown" and zh.record(c, zh.edition(path)).get("source_sha256")
    ]
    if not translated:
        pytest.skip("no translated cell yet")
    victim = translated[len(translated) // 2]
    edit(en_path, lambda en: cell(en, victim)["source"].append("\nOne more English sentence."))
    found = zh_check.check_file(copied)
    assert any(f"id {victim}" in p and "stale" in p for p in found), found


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_real_notebook_changing_code_or_output_fails(path, tmp_path):
    copied = copy_pair(path, tmp_path)
    text = copied.read_text(encoding="utf-8")
    original = json.loads(text)
    with_output = [c for c in original["cells"] if c["cell_type"] == "code" and c["outputs"]]
    victim = with_output[0]["id"]
    edit(copied, lambda nb: cell(nb, victim)["source"].append("\n# 注释"))
    assert any(f"id {victim}" in p and "source differs" in p for p in zh_check.check_file(copied))
    copied.write_text(text, encoding="utf-8")
    out = cell(original, victim)["outputs"][0]
    edit(copied, lambda nb: cell(nb, victim)["outputs"].append(out))
    assert any(f"id {victim}" in p and "outputs differs" in p for p in zh_check.check_file(copied))


def test_chinese_readme_and_glossary_links_resolve():
    for doc in (ROOT / "docs" / "zh").glob("*.md"):
        for link in re.findall(r"\]\(([^)#\s]+)", doc.read_text(encoding="utf-8")):
            if not re.match(r"^[a-z]+:", link):
                assert (doc.parent / link).exists(), f"{doc.name}: {link}"


# --- the glossary, enforced -----------------------------------------------------------------------


def banned_variants() -> list[str]:
    """The regular expressions of the glossary's table of variants not to use (不用的写法)."""
    text = (ROOT / "docs" / "zh" / "glossary.md").read_text(encoding="utf-8")
    section = text.split("## 不用的写法", 1)[1].split("\n## ", 1)[0]
    rows = [re.match(r"\| (`+) ?(.+?) ?\1 \|", line) for line in section.splitlines()]
    return [row.group(2).replace("\\|", "|") for row in rows if row]


def variants_in(texts: dict[str, str], patterns: list[str]) -> list[str]:
    """Each use of a banned variant in `texts` (where -> text): where, and the words around it."""
    return [
        f"{where}: {m.group(0)!r} in ...{text[max(0, m.start() - 10) : m.end() + 10]}..."
        for pattern in patterns
        for where, text in texts.items()
        for m in re.finditer(pattern, text)
    ]


def chinese_texts() -> dict[str, str]:
    """The Chinese prose: every Chinese notebook's markdown cells, docs/zh/ but the glossary."""
    texts = {
        f"{zh.rel(path)} cell {c['id']}": zh.source(c)
        for path in ZH_FILES
        for c in nbtools.load(path)["cells"]
        if c["cell_type"] == "markdown"
    }
    for doc in sorted((ROOT / "docs" / "zh").glob("*.md")):
        if doc.name != "glossary.md":
            texts[f"docs/zh/{doc.name}"] = doc.read_text(encoding="utf-8")
    return texts


def test_the_glossary_lists_the_variants_it_bans():
    assert {"微批次", "归约", "个 ?GPU"} <= set(banned_variants())
    for pattern in banned_variants():
        re.compile(pattern)  # each one a valid regular expression


def test_no_chinese_text_uses_a_variant_the_glossary_bans():
    assert variants_in(chinese_texts(), banned_variants()) == []


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("流水线把小批量切成 4 个微批次。", ["微批次"]),
        ("两个 GPU 之间，每个GPU 一个进程。", ["个 GPU", "个GPU"]),
        ("上面的单元把每种大小再测一次；nn.Sequential 的每个单元各算一次。", ["上面的单元"]),
        ("上面的单元格、四块 GPU、微批量、全规约：都按术语表。", []),
    ],
)
def test_a_banned_variant_is_found_and_named(text, found):
    said = variants_in({"lesson": text}, banned_variants())
    assert [s.split("'")[1] for s in said] == found
