"""Sphinx settings of the course website, one edition per build (scripts/make_site.py).

The sources are generated copies under build/site-src/<lang>/ (the committed notebooks with their
outputs, the docs pages, the README as the home page, and a copy of this folder, so that every
path here is relative to the sources); nothing is executed. `D2L_GPU_SITE_LANG`
says which edition: "en" builds build/site/, "zh" builds build/site/zh/. Everything a page loads
is served from the site itself: MathJax from the slides' local copy, the theme's own fonts and
icons; no widget scripts from a CDN.
"""

import json
import os
from pathlib import Path

LANG = os.environ.get("D2L_GPU_SITE_LANG", "en")
project = "d2l-gpu"
author = "the d2l-gpu authors"
copyright = "the d2l-gpu authors, MIT licence"  # noqa: A001 - Sphinx's name
language = "zh_CN" if LANG == "zh" else "en"
html_title = "d2l-gpu 中文版" if LANG == "zh" else "d2l-gpu"

extensions = ["myst_nb", "sphinx.ext.mathjax"]
nb_execution_mode = "off"  # the committed outputs, validated by nbval, are what a page shows
nb_ipywidgets_js = {}  # no require.js or widget manager from a CDN
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
exclude_patterns = ["_*", "edition.json"]
templates_path = ["_templates"]
html_static_path = ["_static", "_vendor"]
html_extra_path = ["_extra"]
html_css_files = ["d2l-gpu.css"]
html_favicon = "_static/favicon.svg"  # else the browser asks for /favicon.ico, a 404
html_theme = "sphinx_book_theme"
html_theme_options = {
    "use_download_button": True,
    "use_fullscreen_button": False,
    "home_page_in_toc": True,
    "show_toc_level": 2,
}
html_context = {"default_mode": "auto"}  # light or dark as the reader's system says
html_sidebars = {"**": ["navbar-logo.html", "edition-switch.html", "search-button-field.html",
                        "sbt-sidebar-nav.html"]}  # fmt: skip
html_last_updated_fmt = None
html_copy_source = True
# MathJax 2 from the slides' vendor folder (make_slides.py fetches it once from npm)
mathjax_path = "mathjax/MathJax.js?config=TeX-AMS_CHTML-full,Safe"
# myst-nb marks a notebook's text tex2jax_ignore and its math spans "math" (MathJax 3's setting)
mathjax2_config = {
    "tex2jax": {"processClass": "tex2jax_process|mathjax_process|math|output_area",
                "processEscapes": True},
    "menuSettings": {"zoom": "None"},
    "messageStyle": "none",  # no "Processing math" box over the page
}  # fmt: skip

if LANG == "zh":  # Sphinx's Chinese search splits words with jieba: quietly, its cache in build/
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)
    jieba.dt.tmp_dir = os.environ.get("D2L_GPU_SITE_CACHE")

OTHER = {"en": ("zh/", "中文"), "zh": ("../", "English")}[LANG]
SAID = {
    "en": ("Outputs from a run on {cpu} ({cores} cores, accelerator: {accelerator}), PyTorch "
           "{torch}, profile {profile}, {date}.", "Download the notebook", "Slides"),
    "zh": ("输出来自一次运行：{cpu}（{cores} 核，加速器：{accelerator}），PyTorch {torch}，"
           "配置 {profile}，{date}。", "下载 notebook", "幻灯片"),
}[LANG]  # fmt: skip


def _edition(srcdir: str) -> dict:
    """What make_site.py wrote: "records" ({docname: (execution record, the notebook's file,
    its deck)}) and "other_pages" (the document names of the other edition)."""
    path = Path(srcdir) / "edition.json"
    return json.loads(path.read_text()) if path.exists() else {"records": {}, "other_pages": []}


def _page_context(app, pagename, templatename, context, doctree):
    """The edition switch for every page; the run's record, download and slides for a notebook."""
    pathto = context["pathto"]
    same = pagename if pagename in app.d2l_edition["other_pages"] else "index"
    context["d2l_other_url"] = pathto(OTHER[0] + same + ".html", 1)
    context["d2l_other_label"] = OTHER[1]
    entry = app.d2l_edition["records"].get(pagename)
    if entry is None or "body" not in context:
        return
    record, notebook, deck = entry
    text, download, slides = SAID
    links = [f'<a class="reference download" href="{pathto(notebook, 1)}" download>{download}</a>']
    if deck:
        links.append(f'<a class="reference external" href="{pathto(deck, 1)}">{slides}</a>')
    said = text.format(**record) if record else ""
    context["body"] = (f'<p class="d2l-record">{said} {" · ".join(links)}</p>\n'
                       + context["body"])  # fmt: skip


def _chinese_stemmer(app, exception):
    """Sphinx 9.0 names the Chinese edition's stemmer ChineseStemmer in language_data.js but
    ships the English one (its Python side stems Latin words in English too): every page stopped
    with "ChineseStemmer is not defined" and the search found nothing. Point it at the English."""
    path = Path(app.outdir, "_static", "language_data.js")
    if exception is None and LANG == "zh" and path.exists():
        text = path.read_text(encoding="utf-8")
        path.write_text(text.replace("= ChineseStemmer;", "= EnglishStemmer;"), encoding="utf-8")


def setup(app):
    app.d2l_edition = _edition(app.srcdir)
    app.connect("html-page-context", _page_context)
    app.connect("build-finished", _chinese_stemmer)
