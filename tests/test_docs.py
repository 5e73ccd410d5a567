"""The README starts a student in one screen and its pages are where it says (issue 40): the
README stays short, and every relative link of the README and of docs/ points at a file that
exists (a page moved without its links fails here, with the link named)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def broken_links(page: Path, text: str) -> list[str]:
    """The relative link targets in `text` (a page at `page`) that do not exist."""
    targets = [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]
    return [t for t in targets if not (page.parent / t).exists()]


def test_the_readme_fits_in_one_screen_of_reading():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 150, f"README.md has {lines} lines; move details into a page of docs/"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_points_at_a_file(page):
    assert not broken_links(page, page.read_text(encoding="utf-8"))


def test_a_link_to_a_moved_page_is_caught():
    text = "[setup](docs/setup.md), [gone](docs/old-layout.md), [web](https://d2l.ai)"
    assert broken_links(ROOT / "README.md", text) == ["docs/old-layout.md"]
