"""What a built site (scripts/make_site.py) holds: its pages, and the links between them that
lead nowhere. Used by the browser test of the site and by its unit tests."""

from __future__ import annotations

import html.parser
import posixpath
from pathlib import Path
from urllib.parse import unquote, urlsplit

# folders of the build that are not pages of an edition: assets, sources, the decks
NOT_PAGES = ("_static", "_sources", "_downloads", "_images", "jupyter_execute", "slides",
             "download", "files")  # fmt: skip


def site_pages(site: Path, edition: str) -> list[str]:
    """The HTML pages of one edition ("en" or "zh"), as paths relative to `site`."""
    top = site if edition == "en" else site / "zh"
    found = []
    for path in sorted(top.rglob("*.html")):
        rel = path.relative_to(top).parts
        if rel[0] in NOT_PAGES or (edition == "en" and rel[0] == "zh"):
            continue
        found.append(str(path.relative_to(site)).replace("\\", "/"))
    return found


class _Links(html.parser.HTMLParser):
    """The href of every <a> and the id of every element of one page."""

    def __init__(self):
        super().__init__()
        self.hrefs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"])
        if tag == "a" and values.get("href"):
            self.hrefs.append(values["href"])


def _parse(path: Path) -> _Links:
    links = _Links()
    links.feed(path.read_text(encoding="utf-8"))
    return links


def broken_links(site: Path) -> list[str]:
    """Every link from a page of `site` to a file or anchor of the site that does not exist, as
    "page -> href" (links that leave the site, and the decks' insides, are not followed)."""
    parsed: dict[Path, _Links] = {}

    def links_of(path: Path) -> _Links:
        if path not in parsed:
            parsed[path] = _parse(path)
        return parsed[path]

    broken = []
    pages = site_pages(site, "en") + site_pages(site, "zh")
    for rel in pages:
        page = site / rel
        for href in links_of(page).hrefs:
            parts = urlsplit(href)
            if parts.scheme or parts.netloc or href.startswith(("mailto:", "javascript:")):
                continue
            target = page if not parts.path else page.parent / unquote(parts.path)
            target = Path(posixpath.normpath(str(target).replace("\\", "/")))
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file() or site.resolve() not in target.resolve().parents:
                broken.append(f"{rel} -> {href}")
            elif parts.fragment and target.suffix == ".html":
                if unquote(parts.fragment) not in links_of(target).ids:
                    broken.append(f"{rel} -> {href} (no such anchor)")
    return broken
