"""The course website (`make site`) opened page by page in headless Chromium, served on 127.0.0.1.

Run by `make test-browser`, which builds the site first. Every page of both editions: status 200,
no console error, no request that leaves the machine, every image loaded, every formula typeset
by the local MathJax, code highlighted, the edition switch pointing at a page that exists, the
language set (and Chinese text on the Chinese pages); every link between pages resolves, anchors
included; the search finds a word in each language; a lesson fits a phone's width. Screenshots go
to build/site-shots/.
"""

import functools
import http.server
import os
import re
import threading
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright
from site_links import broken_links, site_pages

ROOT = Path(__file__).resolve().parents[2]
SITE, SHOTS = ROOT / "build" / "site", ROOT / "build" / "site-shots"
CHROMIUM = "/usr/bin/chromium"
HAN = re.compile(r"[\u4e00-\u9fff]")
pytestmark = pytest.mark.skipif(
    os.environ.get("D2L_GPU_BROWSER") != "1", reason="browser tests: make test-browser"
)


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # no line per request
        pass


@pytest.fixture(scope="module")
def server():
    """build/site served on 127.0.0.1 (a free port) for the module's tests."""
    if not (SITE / "index.html").exists() or not (SITE / "zh" / "index.html").exists():
        pytest.fail("no website in build/site: run `make site` (make test-browser builds it)")
    handler = functools.partial(Quiet, directory=str(SITE))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


class Visit:
    """A page opened with every request watched: outside ones are refused and recorded."""

    def __init__(self, browser, base: str, **context):
        self.base, self.outside, self.errors = base, [], []
        self.context = browser.new_context(**context)
        self.context.route(re.compile(r"^(?!http://127\.0\.0\.1[:/]|data:|blob:)"), self._refuse)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def _refuse(self, route):
        self.outside.append(route.request.url)
        route.abort()

    def open(self, path: str):
        response = self.page.goto(self.base + path)
        self.page.wait_for_load_state("load")
        return response

    def close(self):
        self.context.close()


@pytest.mark.parametrize("edition", ["en", "zh"])
def test_every_page_loads_whole_and_offline(server, browser, edition):
    pages = site_pages(SITE, edition)
    assert len(pages) >= 30, pages  # 14 lessons, 14 solutions, the guides, home, search
    visit = Visit(browser, server)
    problems = []
    for rel in pages:
        visit.errors.clear()
        response = visit.open(rel)
        page = visit.page
        if response is None or response.status != 200:
            problems.append(f"{rel}: status {response and response.status}")
            continue
        if page.locator("span.math, div.math").count():
            try:
                page.wait_for_function(
                    "document.querySelectorAll('span.math, div.math').length <="
                    " document.querySelectorAll('.MathJax_CHTML').length",
                    timeout=60_000,
                )
            except Exception:  # noqa: BLE001 - said as a problem of the page
                problems.append(f"{rel}: formulas not typeset by MathJax")
        bad = page.evaluate(
            "[...document.images].filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)"
        )
        problems += [f"{rel}: image not loaded: {src}" for src in bad]
        if page.locator("div.highlight pre").count():
            if not page.locator("div.highlight pre span[class]").count():
                problems.append(f"{rel}: code not highlighted")
        lang = page.evaluate("document.documentElement.lang")
        if lang != ("zh-CN" if edition == "zh" else "en"):
            problems.append(f"{rel}: html lang {lang!r}")
        if edition == "zh" and rel.startswith(("lessons/", "solutions/", "index")):
            article = page.locator("article")
            text = article.first.inner_text() if article.count() else ""
            if len(HAN.findall(text)) < 50:
                problems.append(f"{rel}: hardly any Chinese on a Chinese page")
        switch = page.locator("div.d2l-edition a")
        if not switch.count():
            problems.append(f"{rel}: no switch to the other edition")
        else:
            other = page.evaluate("a => a.href", switch.first.element_handle())
            target = SITE / other.removeprefix(server).split("#")[0]
            if not target.is_file():
                problems.append(f"{rel}: the edition switch points at a missing page {other}")
        problems += [f"{rel}: console: {e}" for e in visit.errors]
    problems += [f"request that left the machine: {u}" for u in visit.outside]
    visit.close()
    assert not problems, "\n".join(problems)


def test_every_link_between_pages_resolves():
    assert broken_links(SITE) == []


@pytest.mark.parametrize(
    ("path", "word", "expect"),
    [("search.html", "allreduce", "lessons/05-data-parallel"),
     ("zh/search.html", "全规约", "zh/lessons/05-data-parallel")],
)  # fmt: skip
def test_search_finds_a_word_in_each_language(server, browser, path, word, expect):
    visit = Visit(browser, server)
    visit.open(f"{path}?q={word}")
    visit.page.wait_for_function(
        "document.querySelectorAll('#search-results li').length > 0", timeout=60_000
    )
    hrefs = visit.page.eval_on_selector_all("#search-results li a", "as => as.map(a => a.href)")
    assert any(expect in h for h in hrefs), hrefs
    assert not visit.errors and not visit.outside, (visit.errors, visit.outside)
    visit.close()


LESSON = "lessons/05-data-parallel.html"


@pytest.mark.parametrize("path", [LESSON, f"zh/{LESSON}"])
def test_a_lesson_fits_a_phone(server, browser, path):
    """At 375 px the prose does not scroll sideways; wide code, outputs and tables scroll in
    their own box. A screenshot of each edition, on a desktop and a phone, is kept."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    name = path.replace("/", "-").removesuffix(".html")
    desk = Visit(browser, server, viewport={"width": 1280, "height": 900})
    desk.open(path)
    desk.page.screenshot(path=str(SHOTS / f"{name}.png"))
    desk.close()
    phone = Visit(browser, server, viewport={"width": 375, "height": 740}, is_mobile=True)
    phone.open(path)
    page = phone.page
    assert page.evaluate("document.documentElement.scrollWidth") <= 376
    unboxed = page.evaluate(
        """[...document.querySelectorAll('article pre, article table')].filter(e => {
             for (let n = e; n && n.tagName !== 'ARTICLE'; n = n.parentElement) {
               const o = getComputedStyle(n).overflowX;
               if (o === 'auto' || o === 'scroll') return false;
             }
             return e.scrollWidth > e.clientWidth + 1;
           }).length"""
    )
    assert unboxed == 0
    page.screenshot(path=str(SHOTS / f"{name}-phone.png"))
    assert not phone.errors and not phone.outside, (phone.errors, phone.outside)
    phone.close()
