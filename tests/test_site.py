"""The website's builder (scripts/make_site.py) without Sphinx: every page of both editions is
taken, every link of every page maps to a page or file of the site, and a link to a file that
does not exist stops the build with its name. The built site is opened in a browser by
tests/browser/test_site.py (make test-browser)."""

import json
from pathlib import Path

import make_site
import pytest
from make_site import SiteError, docname, pages, rewrite, site_target, toctree
from site_links import broken_links, site_pages

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_lesson_solution_and_guide_is_a_page(lang):
    sub = "" if lang == "en" else "zh/"
    found = pages(lang)
    for folder in ("notebooks", "solutions"):
        notebooks = sorted((ROOT / folder / sub).glob("*.ipynb"))
        assert len(notebooks) >= 14
        assert {f"{folder}/{sub}{p.name}" for p in notebooks} <= set(found)
    guides = {Path(p).name for p in found if p.startswith("docs/")}
    assert {p.name for p in (ROOT / "docs").glob("*.md")} <= guides  # a translation or the English
    assert found[0] == make_site.home(lang)
    names = {docname(p) for p in found}
    assert len(names) == len(found)  # no two files on one page
    tree = toctree(lang, found)
    assert all(name in tree for name in names - {"index"})


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_link_of_every_page_maps_into_the_site(lang):
    members = set(pages(lang))
    for page in members:
        linked: set[str] = set()
        text = (ROOT / page).read_text(encoding="utf-8")
        if page.endswith(".ipynb"):  # the builder rewrites the markdown cells
            cells = json.loads(text)["cells"]
            text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        rewrite(text, page, lang, members, linked)  # raises on a link to a missing file
        assert all((ROOT / p).exists() for p in linked)


def test_links_follow_the_sites_layout():
    en, zh = set(pages("en")), set(pages("zh"))
    assert site_target("notebooks/05-data-parallel.ipynb", "README.md", "en", en) == (
        "lessons/05-data-parallel.ipynb", False)  # fmt: skip
    assert site_target("../notebooks/07-ddp-torchrun.ipynb#x", "docs/faults.md", "en", en) == (
        "../lessons/07-ddp-torchrun.ipynb#x", False)  # fmt: skip
    assert site_target("../img/devices.svg", "notebooks/01-devices.ipynb", "en", en) == (
        "../img/devices.svg", False)  # fmt: skip
    assert site_target("../../img/devices.svg", "notebooks/zh/01-devices.ipynb", "zh", zh) == (
        "../img/devices.svg", False)  # fmt: skip
    # a file that is not a page becomes a download under files/
    assert site_target("../scripts/slurm/train.sbatch", "docs/training-script.md", "en", en) == (
        "../files/scripts/slurm/train.sbatch", False)  # fmt: skip
    # to the other edition: a URL of the built site, written as HTML
    assert site_target("docs/zh/README.md", "README.md", "en", en) == ("zh/index.html", True)
    assert site_target("../course-plan.md", "docs/zh/README.md", "zh", zh) == (
        "../docs/course-plan.html", True)  # fmt: skip
    out = rewrite("see [中文](docs/zh/README.md)", "README.md", "en", en, set())
    assert out == 'see <a href="zh/index.html">中文</a>'


def test_a_link_to_a_missing_file_is_refused_with_its_name():
    with pytest.raises(SiteError, match="docs/setup.md links to ../notebooks/99-none.ipynb"):
        site_target("../notebooks/99-none.ipynb", "docs/setup.md", "en", set(pages("en")))
    with pytest.raises(SiteError, match="not a file of the project"):
        site_target("../../etc/passwd", "docs/setup.md", "en", set())


def test_broken_links_finds_missing_pages_and_anchors(tmp_path):
    """The link check of the built site, on a small site made by hand (negative controls)."""
    (tmp_path / "lessons").mkdir()
    (tmp_path / "zh").mkdir()
    (tmp_path / "index.html").write_text(
        '<a href="lessons/a.html#goals">ok</a> <a href="lessons/b.html">gone</a>'
        ' <a href="lessons/a.html#nowhere">bad anchor</a> <a href="https://d2l.ai">web</a>'
        ' <a href="#top">self</a><p id="top"></p>'
    )
    (tmp_path / "lessons" / "a.html").write_text('<h2 id="goals">Goals</h2><a href="../zh/">zh</a>')
    (tmp_path / "zh" / "index.html").write_text('<a href="../index.html">en</a>')
    assert site_pages(tmp_path, "en") == ["index.html", "lessons/a.html"]
    assert site_pages(tmp_path, "zh") == ["zh/index.html"]
    assert broken_links(tmp_path) == [
        "index.html -> lessons/b.html",
        "index.html -> lessons/a.html#nowhere (no such anchor)",
    ]
