"""Build the course website: `make site` (or `python scripts/course.py site`).

Two editions, English in build/site/ and Chinese in build/site/zh/, each a Sphinx build
(site/conf.py, myst-nb, the book theme) of generated sources under build/site-src/<lang>/:

- the README (docs/zh/README.md for Chinese) as the home page, with every page in its toctree;
- lessons/ and solutions/: the committed notebooks with their outputs (nothing is executed);
- docs/: the docs pages (the Chinese edition takes a page's translation where there is one);
- img/: the diagrams; files/: any other file of the project a page links to, offered as a download;
- _extra/download/: the notebooks as committed, for the "Download the notebook" link;
- edition.json: each notebook's execution record, and the pages the other edition has (a page
  without a counterpart, such as the Chinese glossary, switches to the other edition's home).

Links are rewritten from the project's layout to the site's (`site_target`), so a link that works
on GitHub works on the site; one to a file that does not exist stops the build with its name. The
slides (build/slides, `make slides`) are copied into build/site/slides/ and linked from each lesson.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
SITE, SOURCES, SLIDES = BUILD / "site", BUILD / "site-src", BUILD / "slides"
LANGS = ("en", "zh")
CAPTIONS = {
    "en": {"lessons": "Lessons", "solutions": "Solutions", "docs": "Guides"},
    "zh": {"lessons": "课程", "solutions": "参考答案", "docs": "指南"},
}
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")


class SiteError(Exception):
    """A build that cannot go on, said in one sentence."""


def home(lang: str) -> str:
    """The project file that is the edition's home page."""
    return "README.md" if lang == "en" else "docs/zh/README.md"


def edition_of(repo_path: str) -> str | None:
    """Which edition a project file belongs to ("en", "zh"), or None for a shared file."""
    parts = PurePosixPath(repo_path).parts
    if repo_path == home("zh") or (len(parts) > 1 and parts[1] == "zh"):
        return "zh"
    if parts[0] in ("notebooks", "solutions", "docs") or repo_path == home("en"):
        return "en"
    return None


def page_path(repo_path: str) -> str:
    """Where a project file lives inside its edition's sources (README -> index.md, ...)."""
    if repo_path in (home("en"), home("zh")):
        return "index.md"
    parts = PurePosixPath(repo_path).parts
    if parts[0] == "notebooks":
        return "lessons/" + parts[-1]
    if parts[0] in ("solutions", "docs"):
        return f"{parts[0]}/{parts[-1]}"
    if parts[0] == "img":
        return repo_path
    return "files/" + repo_path


def site_target(link: str, page: str, lang: str, members: set[str]) -> tuple[str, bool]:
    """(target, raw) for `link` found in project file `page`, on the `lang` edition's page.

    A link to a page of the edition (`members`) or to a shared file becomes a path relative to
    the page's place in the sources, which Sphinx resolves; a link to a page of the other edition
    becomes a URL of the built site (raw=True), written as HTML. Web links and anchors are kept."""
    if re.match(r"^[a-z][a-z0-9+.-]*:|^#", link):
        return link, False
    path, _, anchor = link.partition("#")
    target = os.path.normpath(os.path.join(os.path.dirname(page), path)).replace(os.sep, "/")
    if target.startswith("..") or not (ROOT / target).exists():
        raise SiteError(f"make_site: {page} links to {link}, which is not a file of the project")
    here = PurePosixPath(page_path(page)).parent
    there = page_path(target)
    depth = "../" * len(here.parts)
    owner = edition_of(target)
    frag = f"#{anchor}" if anchor else ""
    if owner is not None and target not in members:
        html = re.sub(r"\.(md|ipynb)$", ".html", there)
        prefix = "zh/" if owner == "zh" else "../"
        return depth + prefix + html + frag, True
    return os.path.relpath(there, here).replace(os.sep, "/") + frag, False


def rewrite(text: str, page: str, lang: str, members: set[str], linked: set[str]) -> str:
    """Markdown `text` of project file `page` with its links pointed at the site's pages; the
    project files it links to that are not pages are added to `linked`."""

    def one(m: re.Match) -> str:
        target, raw = site_target(m.group(2), page, lang, members)
        if raw:
            label = m.group(1).removeprefix("!")[1:-2]  # "[label](" without its brackets
            return f'<a href="{target}">{label}</a>'
        if not re.match(r"^[a-z][a-z0-9+.-]*:|^#", m.group(2)):
            path = m.group(2).partition("#")[0]
            linked.add(os.path.normpath(os.path.join(os.path.dirname(page), path)))
        return m.group(1) + target + m.group(3)

    return LINK.sub(one, text)


def pages(lang: str) -> list[str]:
    """The project files of the `lang` edition, home page first."""
    sub = "" if lang == "en" else "zh/"
    found = [home(lang)]
    for folder in ("notebooks", "solutions"):
        found += sorted(str(p.relative_to(ROOT)) for p in (ROOT / folder / sub).glob("*.ipynb"))
    docs = {p.name: str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").glob("*.md"))}
    if lang == "zh":  # a page's translation where there is one, the English page elsewhere
        for p in sorted((ROOT / "docs/zh").glob("*.md")):
            if p.name != "README.md":
                docs[p.name] = str(p.relative_to(ROOT))
    return found + sorted(docs.values(), key=lambda p: PurePosixPath(p).name)


def toctree(lang: str, files: list[str]) -> str:
    """The hidden toctrees of the home page: lessons, solutions, guides."""
    out = []
    for folder, caption in CAPTIONS[lang].items():
        names = [docname(f) for f in files[1:] if docname(f).startswith(folder + "/")]
        out.append(f"\n```{{toctree}}\n:hidden:\n:caption: {caption}\n\n" + "\n".join(names)
                   + "\n```\n")  # fmt: skip
    return "".join(out)


def write_sources(lang: str, vendor: Path) -> Path:
    """Generate the `lang` edition's Sphinx sources; return their folder."""
    src = SOURCES / lang
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(ROOT / "site", src)
    shutil.copytree(vendor, src / "_vendor" / "mathjax")
    files, linked, records = pages(lang), set(), {}
    members = set(files)
    for page in files:
        dest = src / page_path(page)
        dest.parent.mkdir(parents=True, exist_ok=True)
        text = (ROOT / page).read_text(encoding="utf-8")
        if page.endswith(".md"):
            text = rewrite(text, page, lang, members, linked)
            dest.write_text(text + (toctree(lang, files) if dest.name == "index.md" else ""))
            continue
        nb = json.loads(text)
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown":
                cell["source"] = rewrite("".join(cell["source"]), page, lang, members, linked)
        dest.write_text(json.dumps(nb, ensure_ascii=False))
        copy = src / "_extra" / "download" / PurePosixPath(page).parts[0] / dest.name
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / page, copy)
        deck = f"{'zh-' if lang == 'zh' else ''}{dest.stem}.slides.html"
        in_site = "../" if lang == "zh" else ""
        has_deck = page.startswith("notebooks/") and (SLIDES / deck).exists()
        records[docname(page)] = (
            nb["metadata"].get("d2l_gpu", {}).get("execution"),
            str(copy.relative_to(src / "_extra")),
            f"{in_site}slides/{deck}" if has_deck else None,
        )
    for path in sorted(linked):  # project files a page links to that are not pages themselves
        rel = path.replace(os.sep, "/")
        dest = src / page_path(rel)
        if (ROOT / rel).is_file() and not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / rel, dest)
    other = "zh" if lang == "en" else "en"
    counterparts = ["search", "genindex"] + [docname(f) for f in pages(other)]
    edition = {"records": records, "other_pages": counterparts}
    (src / "edition.json").write_text(json.dumps(edition, ensure_ascii=False, indent=1))
    return src


def docname(repo_path: str) -> str:
    """The Sphinx document name of a project file in its edition (lessons/01-devices, ...)."""
    path = page_path(repo_path)
    return path[: -len(PurePosixPath(path).suffix)]


def build(lang: str, src: Path, python: str = sys.executable) -> Path:
    """Run Sphinx over `src`; warnings stop the build. Return the edition's folder."""
    out = SITE if lang == "en" else SITE / "zh"
    cmd = [python, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going", "-j", "auto",
           "-d", str(BUILD / "site-doctrees" / lang), str(src), str(out)]  # fmt: skip
    env = {**os.environ, "D2L_GPU_SITE_LANG": lang, "D2L_GPU_SITE_CACHE": str(BUILD)}
    print("+", " ".join(cmd), flush=True)
    if subprocess.run(cmd, env=env).returncode != 0:
        raise SiteError(f"make_site: Sphinx stopped on the {lang} edition (its warnings above)")
    return out


def main() -> int:
    vendor = SLIDES / "vendor" / "mathjax"
    if not (vendor / "MathJax.js").exists():
        print("make_site: no local MathJax in build/slides/vendor; run `make slides` first",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        shutil.rmtree(SITE, ignore_errors=True)
        for lang in LANGS:
            build(lang, write_sources(lang, vendor))
    except SiteError as e:
        print(e, file=sys.stderr)
        return 1
    shutil.copytree(SLIDES, SITE / "slides", dirs_exist_ok=True)
    print(f"the site is in {SITE.relative_to(ROOT)}/ (index.html; zh/index.html): serve it with "
          f"`python -m http.server -d {SITE.relative_to(ROOT)}`")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
