"""scripts/run_lessons.py and nbtools go on past a bad notebook and say what happened in words."""

from __future__ import annotations

import json

import nbformat
import nbtools
import run_lessons


def notebook(*sources: str) -> str:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    return nbtools.dumps(nbtools.tidy(nb))


def test_a_malformed_notebook_is_a_failed_row_and_the_others_still_run(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(run_lessons, "OUT", tmp_path / "out")
    bad = tmp_path / "01-bad.ipynb"
    bad.write_text('{"cells": [')  # cut off mid-write
    slow = tmp_path / "02-slow.ipynb"
    slow.write_text(notebook("print('first')", "import time\ntime.sleep(30)"))
    status = run_lessons.main([str(bad), str(slow), "--timeout", "2"])
    out = capsys.readouterr().out
    assert status == 1
    assert "FAILED 01-bad: 01-bad.ipynb is not a readable notebook" in out
    assert "FAILED 02-slow: cell 1 ('import time'): ran past the limit of 2 s per cell" in out
    assert "Traceback" not in out and "ZMQError" not in out and "-----" not in out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [r["status"] for r in summary["lessons"]] == ["FAILED", "FAILED"]


def test_the_chinese_lessons_run_into_a_folder_of_their_own(tmp_path, monkeypatch, capsys):
    zh = run_lessons.default_notebooks("zh")
    assert [p.name for p in zh] == [p.name for p in run_lessons.default_notebooks()]
    assert all(p.parent.name == "zh" for p in zh)
    monkeypatch.setattr(run_lessons, "OUT", tmp_path / "out")
    lesson = tmp_path / "01-tiny.ipynb"
    lesson.write_text(notebook("print('你好')"))
    assert run_lessons.main([str(lesson), "--lang", "zh"]) == 0
    assert "你好" in (tmp_path / "out" / "zh" / "01-tiny.ipynb").read_text(encoding="utf-8")
    assert (tmp_path / "out" / "zh" / "summary.json").is_file()
    assert not (tmp_path / "out" / "01-tiny.ipynb").exists()  # the English copies are apart


def test_tidy_says_a_deeply_nested_file_is_no_notebook(tmp_path, capsys):
    deep = tmp_path / "deep.ipynb"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    good = tmp_path / "good.ipynb"
    good.write_text(notebook("1 + 1"))
    assert nbtools.main(["tidy", str(deep), str(good)]) == 1
    out = capsys.readouterr().out
    assert f"not tidied: {deep}: cannot read: nested too deeply" in out
    assert nbtools.main(["check", str(deep)]) == 1


def test_the_readme_key_results_are_the_committed_notebooks():
    """docs/measurements.md's table says what each committed notebook's key-result cell printed
    (issue 41): `python scripts/run_lessons.py --key-results` writes them; a typed figure fails."""
    text = run_lessons.MEASUREMENTS.read_text(encoding="utf-8")
    assert run_lessons.table_with_key_results(text) == text, (
        "docs/measurements.md's key results differ from the committed notebooks: run "
        "`python scripts/run_lessons.py --key-results`"
    )


def test_the_key_results_are_rewritten_from_the_notebook(tmp_path):
    """The negative control: a typed key result is replaced by the notebook's."""
    cell = nbformat.v4.new_code_cell("print('x')", metadata={"tags": ["key-result"]})
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="first\nall good: True\n")]
    (tmp_path / "01-a.ipynb").write_text(nbformat.writes(nbformat.v4.new_notebook(cells=[cell])))
    typed = "intro\n| 01-a | ok | 1.0¹ | all good: 0.93x |\n| 02-b | ok | 2.0 | kept |\n"
    out = run_lessons.table_with_key_results(typed, tmp_path)
    assert out == "intro\n| 01-a | ok | 1.0¹ | all good: True |\n| 02-b | ok | 2.0 | kept |\n"
