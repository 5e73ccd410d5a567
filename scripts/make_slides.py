"""Render lesson notebooks to reveal.js decks that work offline.

    python scripts/make_slides.py [NB ...]     # default: every lesson, English and Chinese

Writes build/slides/<name>.slides.html, one per notebook (the Chinese lessons of notebooks/zh/
as zh-<name>.slides.html, marked lang="zh-CN"), from the committed outputs (nothing
is executed) with `jupyter nbconvert --to slides`' exporter. reveal.js 5, require.js, jQuery
and MathJax 2 are installed once into build/slides/vendor/ from the npm registry (`npm pack`),
and every deck loads them from there, so the decks need no network when viewed; img/ is
copied to build/slides/img. Open a deck with a browser: file://.../build/slides/01-x.slides.html
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import jinja2
import nbformat
from nbconvert import SlidesExporter
from traitlets.config import Config

from d2l_gpu.processes import kill_tree

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "slides"
VENDOR = OUT / "vendor"
MATHJAX = [
    "MathJax.js",
    "config/TeX-AMS_CHTML-full.js",
    "config/Safe.js",
    "config/local/",
    "jax/input/TeX/",
]
MATHJAX += ["jax/output/CommonHTML/", "jax/element/", "extensions/", "fonts/HTML-CSS/TeX/woff/"]
MATHJAX += ["localization/en/"]
# npm package -> (member prefix inside the tarball's package/ folder, destination under VENDOR)
PACKAGES = {
    "reveal.js@5.2.1": [("dist/", "reveal.js/dist/"), ("plugin/", "reveal.js/plugin/")],
    "requirejs@2.3.8": [("require.js", "require.js")],
    "jquery@3.7.1": [("dist/jquery.min.js", "jquery.min.js")],
    # MathJax 2 (the template calls MathJax.Hub): only what TeX-AMS_CHTML-full needs.
    "mathjax@2.7.9": [(p, f"mathjax/{p}") for p in MATHJAX],
}
# The reveal template also imports mermaid.js from a CDN; the lessons draw no mermaid diagrams.
TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""
REMOTE = re.compile(
    r"""<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=["'](?:https?:)?//|\bfrom\s+['"]https?://"""
)


def _destination(rel: str, members) -> Path | None:
    """Where file `rel` of an npm package goes under VENDOR, if it is wanted."""
    for prefix, dest in members:
        if prefix.endswith("/"):
            if rel.startswith(prefix):
                return VENDOR / dest / rel[len(prefix) :]
        elif rel == prefix:
            return VENDOR / dest
    return None


NPM_TIMEOUT = 300  # seconds for one `npm pack`: a registry that does not answer is given up on


def npm_pack(spec: str, folder: str, npm: str = "npm", timeout: float = NPM_TIMEOUT) -> str:
    """`npm pack SPEC` into `folder`; the tarball's name, or SystemExit with npm's own words."""
    cmd = [npm, "pack", "--silent", spec, "--pack-destination", folder]
    # a session of its own, so that a hanging npm is ended with every process it started
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        proc.communicate()
        sys.exit(
            f"make_slides: `npm pack {spec}` did not finish within {timeout:g} s; is the npm "
            "registry reachable? (npm config get registry)"
        )
    said = (err or out).strip()
    if proc.returncode != 0:
        sys.exit(f"make_slides: `npm pack {spec}` failed (exit {proc.returncode}): {said[-600:]}")
    lines = out.strip().splitlines()
    if not lines or not (Path(folder) / lines[-1]).is_file():
        sys.exit(
            f"make_slides: `npm pack {spec}` wrote no tarball; npm said: {said[-600:] or 'nothing'}"
        )
    return lines[-1]


def install_vendor() -> None:
    """Fetch the JavaScript libraries into build/slides/vendor once (npm pack; npm's cache)."""
    stamp = VENDOR / ".installed"
    if stamp.is_file() and stamp.read_text() == repr(sorted(PACKAGES)):
        return
    if not shutil.which("npm"):
        sys.exit("make_slides: needs npm once to fetch reveal.js (Debian: apt-get install npm)")
    with tempfile.TemporaryDirectory() as tmp:
        for spec, members in PACKAGES.items():
            print(f"fetching {spec} from the npm registry ...", flush=True)
            name = npm_pack(spec, tmp)
            with tarfile.open(Path(tmp) / name) as tar:
                for m in tar.getmembers():
                    rel = m.name.removeprefix("package/")
                    target = _destination(rel, members)
                    if m.isfile() and target:
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(tar.extractfile(m).read())
    stamp.write_text(repr(sorted(PACKAGES)))


def exporter() -> SlidesExporter:
    """nbconvert's slides exporter, pointed at the local copies in vendor/."""
    c = Config()
    c.SlidesExporter.reveal_url_prefix = "vendor/reveal.js"
    c.SlidesExporter.reveal_theme = "white"
    c.SlidesExporter.reveal_scroll = True
    # Lay slides out at 1280x720 (reveal.js scales to the screen): wider code, more lines per slide.
    c.SlidesExporter.reveal_width = "1280"
    c.SlidesExporter.reveal_height = "720"
    c.SlidesExporter.require_js_url = "vendor/require.js"
    c.SlidesExporter.jquery_url = "vendor/jquery.min.js"
    c.SlidesExporter.mathjax_url = "vendor/mathjax/MathJax.js?config=TeX-AMS_CHTML-full,Safe"
    exp = SlidesExporter(config=c, extra_loaders=[jinja2.DictLoader({"offline.j2": TEMPLATE})])
    exp.template_file = "offline.j2"
    return exp


def expected_slides(nb) -> int:
    """How many reveal.js slides (horizontal + vertical) nbconvert makes of `nb`."""
    types = [c.get("metadata", {}).get("slideshow", {}).get("slide_type", "-") for c in nb["cells"]]
    visible = [i for i, t in enumerate(types) if t not in ("skip", "notes")]
    return 1 + sum(t in ("slide", "subslide") for t in types[visible[0] + 1 :]) if visible else 0


def deck_name(path: Path) -> str:
    """The file name of a notebook's deck, without .slides.html: zh-NN-x for notebooks/zh/NN-x."""
    return f"zh-{path.stem}" if path.parent.name == "zh" else path.stem


def render(path: Path, exp: SlidesExporter) -> Path:
    """Write the deck of one notebook; fail if it still points at the network."""
    nb = nbformat.read(path, as_version=4)
    html, _ = exp.from_notebook_node(nb, resources={"metadata": {"path": str(path.parent)}})
    remote = REMOTE.findall(html)
    if remote:
        raise RuntimeError(f"{path.name}: deck still loads from the network: {remote[:3]}")
    # Decks sit in build/slides beside a copy of img/ (made once, by main): ../img/x.svg
    # (../../img/x.svg from notebooks/zh/) becomes img/x.svg.
    html = re.sub(r"""(src=["'])(?:\.\./)+img/""", r"\1img/", html)
    if path.parent.name == "zh":
        html = re.sub(r"<html( lang=\"[^\"]*\")?>", '<html lang="zh-CN">', html, count=1)
    target = OUT / f"{deck_name(path)}.slides.html"
    target.write_text(html, encoding="utf-8")
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    paths = [Path(a).resolve() for a in args] or [
        *sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb")),
        *sorted((ROOT / "notebooks" / "zh").glob("[0-9][0-9]-*.ipynb")),
    ]
    OUT.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ROOT / "img", OUT / "img", dirs_exist_ok=True)  # every deck's images
    install_vendor()
    exp = exporter()
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        print(f"{render(path, exp).relative_to(ROOT)}: {expected_slides(nb)} slides")
    if not paths:
        print("no lesson notebooks found")
    return 0


if __name__ == "__main__":
    sys.exit(main())
