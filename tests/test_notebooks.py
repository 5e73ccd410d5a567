"""Every lesson notebook is committed in normal form, executed, and follows the lesson rules."""

import copy
import json
import re
from pathlib import Path

import nbtools
import pytest

ROOT = Path(__file__).resolve().parent.parent

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
LESSONS = [p for p in NOTEBOOKS if re.match(r"\d\d-", p.name) and not p.name.startswith("00-")]
IMG_LINK = re.compile(r"""(?:\]\(|src=["'])(\.\./img/[^)"'\s]+\.svg)""")
IGNORE_TAG = "nbval-ignore-output"


def ids(paths):
    return [p.name for p in paths]


def tags(cell):
    return cell.get("metadata", {}).get("tags", [])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_notebook_is_clean(path):
    """nbformat 4.5 with ids, kernelspec, executed in order, no errors, tidy, slide metadata."""
    problems = nbtools.check_file(path)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", LESSONS, ids=ids(LESSONS))
def test_one_key_result_cell(path):
    cells = [c for c in nbtools.load(path)["cells"] if "key-result" in tags(c)]
    assert len(cells) == 1, f"{len(cells)} cells tagged key-result, expected exactly 1"
    assert cells[0]["cell_type"] == "code"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_ignored_outputs_say_why(path):
    """A cell whose output is not compared says why in its metadata, not in the student's code."""
    cells = [c for c in nbtools.load(path)["cells"] if c["cell_type"] == "code"]
    bad = [
        nbtools.first_line(c)
        for c in cells
        if IGNORE_TAG in tags(c) and len(c["metadata"].get("nbval_ignore_reason", "")) < 10
    ]
    assert not bad, f"cells tagged {IGNORE_TAG} without metadata.nbval_ignore_reason: {bad}"
    plumbing = [nbtools.first_line(c) for c in cells if IGNORE_TAG in nbtools.first_line(c)]
    assert not plumbing, f"test plumbing in the student's code: {plumbing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_image_links_exist(path):
    links = {
        link
        for c in nbtools.load(path)["cells"]
        if c["cell_type"] == "markdown"
        for link in IMG_LINK.findall(nbtools._source(c))
    }
    missing = sorted(link for link in links if not (path.parent / link).is_file())
    assert not missing, f"missing images: {missing}"


# --- unit tests of the normaliser on synthetic notebooks ------------------------------------


def messy_notebook():
    """A notebook as an editor might leave it: old minor version, no ids, stray metadata."""

    def code(src, count, **meta):
        out = {"output_type": "execute_result", "execution_count": count}
        out.update(data={"text/plain": "2"}, metadata={})
        meta = {"slideshow": {"slide_type": "-"}, **meta}
        return {
            "cell_type": "code",
            "source": src,
            "execution_count": count,
            "metadata": meta,
            "outputs": [out],
        }

    return {
        "nbformat": 4,
        "nbformat_minor": 4,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python", "version": "3.11.2", "mimetype": "text/x-python"},
            "widgets": {"state": {}},
        },
        "cells": [
            {
                "cell_type": "markdown",
                "source": ["# T", "itle"],
                "metadata": {"slideshow": {"slide_type": "slide"}, "collapsed": False},
            },
            code("1 + 1", 7, ExecuteTime={"end_time": "x"}, tags=["key-result"]),
            code("2 + 0", 3, execution={"iopub.status.busy": "x"}, scrolled=True, tags=[]),
        ],
    }


def test_tidy_normalises():
    nb = nbtools.tidy(messy_notebook())
    assert (nb.nbformat, nb.nbformat_minor) == (4, 5)
    assert all(c.id for c in nb.cells) and len({c.id for c in nb.cells}) == 3
    assert [c.metadata for c in nb.cells] == [
        {"slideshow": {"slide_type": "slide"}},
        {"slideshow": {"slide_type": "-"}, "tags": ["key-result"]},
        {"slideshow": {"slide_type": "-"}},
    ]
    assert nb.metadata == {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    }
    assert [c.execution_count for c in nb.cells[1:]] == [1, 2]
    assert [c.outputs[0].execution_count for c in nb.cells[1:]] == [1, 2]
    assert nb.cells[0].source == "# Title"
    assert nbtools.problems(nbformat_json(nb), nbtools.dumps(nb)) == []


def nbformat_json(nb):
    """The plain JSON dict of a notebook, as read back from disk."""
    return json.loads(nbtools.dumps(nb))


def test_tidy_is_deterministic_idempotent_and_keeps_ids():
    first, second = nbtools.tidy(messy_notebook()), nbtools.tidy(messy_notebook())
    assert nbtools.dumps(first) == nbtools.dumps(second)
    assert nbtools.dumps(nbtools.tidy(first)) == nbtools.dumps(first)
    raw = messy_notebook()
    raw["cells"][1]["id"] = "my-own-id"
    raw["cells"][2]["id"] = "my-own-id"  # a duplicate must be replaced
    tidied = nbtools.tidy(raw)
    assert tidied.cells[1].id == "my-own-id" and tidied.cells[2].id != "my-own-id"


def test_check_catches_a_bad_notebook():
    nb = nbformat_json(nbtools.tidy(messy_notebook()))
    assert nbtools.problems(nb, nbtools.dumps(nb)) == []
    bad = copy.deepcopy(nb)
    del bad["metadata"]["kernelspec"]
    bad["metadata"]["widgets"] = {}
    bad["cells"][0]["metadata"] = {}
    del bad["cells"][1]["id"]
    bad["cells"][1]["metadata"]["collapsed"] = True
    bad["cells"][1]["outputs"] = [
        {"output_type": "error", "ename": "ValueError", "evalue": "boom", "traceback": []}
    ]
    bad["cells"][2]["execution_count"] = None
    found = "\n".join(nbtools.problems(bad))
    for expected in [
        "no kernelspec",
        "stray notebook metadata: widgets",
        "cell 0 ('# Title'): no metadata.slideshow",
        "missing or invalid id",
        "stray metadata ['collapsed']",
        "error output ValueError: boom",
        "code cell not executed",
    ]:
        assert expected in found
    out_of_order = copy.deepcopy(nb)
    out_of_order["cells"][1]["execution_count"] = 2
    assert "execution count 2, expected 1" in "\n".join(nbtools.problems(out_of_order))
    untidy = nbtools.dumps(nb).replace('"id"', '"id"  ', 1)
    assert any("would change under tidy" in p for p in nbtools.problems(nb, untidy))


def test_check_file_flags_invalid_json(tmp_path):
    path = tmp_path / "broken.ipynb"
    nb = nbformat_json(nbtools.tidy(messy_notebook()))
    nb["cells"][1]["outputs"][0]["output_type"] = "bogus"
    path.write_text(json.dumps(nb))
    assert any(p.startswith("invalid nbformat") for p in nbtools.check_file(path))
    assert nbtools.main(["check", str(path)]) == 1
    path.write_text(nbtools.dumps(nbtools.tidy(messy_notebook())))
    assert nbtools.main(["check", str(path)]) == 0
