"""Drawing primitives of the lesson diagrams, and a check that every label fits where it sits.

One palette and four text styles for every diagram. Each primitive returns SVG element strings;
`svg` wraps them into a document. `layout_problems` reads a finished document back and reports
any label wider than its box, crossing a box's edge, overlapping another label or leaving the
canvas, measuring each label with the font the diagrams name first (DejaVu Sans, which is wider
than the fallbacks Helvetica and Arial, so a label that fits here fits there too).
"""

from __future__ import annotations

import functools
import xml.etree.ElementTree as ET
from html import escape
from pathlib import Path

# One palette for every diagram: host (CPU side) blue, device (GPU side) green, links orange.
HOST, HOST_FILL = "#1f5f99", "#e3eef9"
DEV, DEV_FILL = "#2e7d32", "#e6f4e7"
LINK = "#d9822b"
LINK_FILL = "#fdf0e3"
BAD, GOOD = "#c62828", "#2e7d32"
INK, MUTED = "#222222", "#666666"
WAIT_FILL = "#fbe3e3"

# Text styles: (font file, size in px). The CSS below and the fit check both read this table.
FONTS = {
    "title": ("DejaVuSans-Bold.ttf", 17),
    "label": ("DejaVuSans.ttf", 14),
    "small": ("DejaVuSans.ttf", 12),
    "code": ("DejaVuSansMono.ttf", 13),
}

STYLE = f"""
    text {{ font-family: "DejaVu Sans", Helvetica, Arial, sans-serif; fill: {INK}; }}
    .title {{ font-size: 17px; font-weight: bold; }}
    .label {{ font-size: 14px; }}
    .small {{ font-size: 12px; fill: {MUTED}; }}
    .code {{ font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 13px; }}
"""

PAD_X, PAD_Y = 4, 1  # the room a label keeps from the edges of the box it sits in
ASCENT, DESCENT = 0.80, 0.25  # of the font size, above and below the baseline (DejaVu: .76, .24)


def svg(width: int, height: int, title: str, body: list[str]) -> str:
    """A complete SVG document with a title (for screen readers), arrow markers and the body."""
    defs = []
    for name, colour in [("arrow", INK), ("link", LINK), ("bad", BAD), ("good", GOOD)]:
        defs.append(
            f'    <marker id="{name}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            f'markerHeight="7" orient="auto-start-reverse">'
            f'<path d="M0,0 L10,5 L0,10 z" fill="{colour}"/></marker>'
        )
    lines = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img">',
        f"  <title>{escape(title)}</title>",
        f"  <style>{STYLE}  </style>",
        "  <defs>",
        *defs,
        "  </defs>",
        f'  <rect width="{width}" height="{height}" fill="#ffffff"/>',
        *("  " + element for element in body),
        "</svg>",
    ]
    return "\n".join(lines) + "\n"


def box(x, y, w, h, stroke=INK, fill="#ffffff", rx=8, dash=False) -> str:
    """A rounded rectangle."""
    extra = ' stroke-dasharray="6 4"' if dash else ""
    return (
        f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="{rx}" fill="{fill}" '
        f'stroke="{stroke}" stroke-width="2"{extra}/>'
    )


def text(x, y, s, cls="label", anchor="middle", colour=None) -> str:
    """One line of text; `cls` is title, label, small or code."""
    fill = f' style="fill: {colour}"' if colour else ""
    return f'<text x="{x}" y="{y}" class="{cls}" text-anchor="{anchor}"{fill}>{escape(s)}</text>'


def arrow(x1, y1, x2, y2, marker="arrow", colour=INK, width=2, both=False, dash=False) -> str:
    """A straight arrow from (x1, y1) to (x2, y2); `both` puts a head on each end."""
    start = f' marker-start="url(#{marker})"' if both else ""
    extra = ' stroke-dasharray="6 4"' if dash else ""
    return (
        f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{colour}" '
        f'stroke-width="{width}"{extra}{start} marker-end="url(#{marker})"/>'
    )


def link(x1, y1, x2, y2, width=8) -> str:
    """A thick link without arrowheads (for short GPU-to-GPU connections)."""
    return (
        f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{LINK}" '
        f'stroke-width="{width}" stroke-linecap="round"/>'
    )


def chip_grid(x, y, cols, rows, size, gap, colour, fill) -> list[str]:
    """A grid of small squares standing for CPU cores or GPU multiprocessors."""
    return [
        f'<rect x="{x + c * (size + gap)}" y="{y + r * (size + gap)}" width="{size}" '
        f'height="{size}" rx="2" fill="{fill}" stroke="{colour}" stroke-width="1"/>'
        for r in range(rows)
        for c in range(cols)
    ]


def memory_bar(x, y, w, label, colour, fill) -> list[str]:
    """A memory bank drawn as a striped bar with a label inside."""
    cells = [box(x, y, w, 34, colour, fill, rx=4)]
    cells += [
        f'<line x1="{x + i}" y1="{y}" x2="{x + i}" y2="{y + 34}" stroke="{colour}" '
        f'stroke-opacity="0.25"/>'
        for i in range(12, w, 12)
    ]
    return cells + [text(x + w / 2, y + 22, label)]


def gpu_card(x, y, name, device) -> list[str]:
    """One GPU: many multiprocessors and its own memory, named by its PyTorch device string."""
    body = [box(x, y, 240, 190, DEV, DEV_FILL)]
    body.append(text(x + 120, y + 26, name, "title"))
    body.append(text(x + 120, y + 46, f"device '{device}'", "code", colour=DEV))
    body += chip_grid(x + 24, y + 60, 16, 4, 9, 3, DEV, "#ffffff")
    body.append(text(x + 120, y + 122, "thousands of simple cores", "small"))
    body += memory_bar(x + 20, y + 138, 200, "device memory", DEV, "#ffffff")
    return body


def lines(x, y, strings, cls="small", anchor="start", step=18, colour=None) -> list[str]:
    """Several lines of text, one below the other, `step` pixels apart."""
    return [text(x, y + i * step, s, cls, anchor, colour) for i, s in enumerate(strings)]


# --- the fit check --------------------------------------------------------------------------


@functools.cache
def _font(cls: str):
    """The PIL font that measures labels of style `cls` (matplotlib ships the DejaVu files)."""
    import matplotlib
    from PIL import ImageFont

    name, size = FONTS[cls]
    return ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / name), size)


def text_width(s: str, cls: str = "label") -> float:
    """Width in px of `s` set in style `cls`, measured on the font's real glyph advances."""
    return _font(cls).getlength(s)


def _text_box(el) -> tuple[float, float, float, float, str]:
    """(left, top, right, bottom, string) of one <text> element."""
    s, cls = el.text or "", el.get("class", "label")
    x, y, width = float(el.get("x")), float(el.get("y")), text_width(s, cls)
    size = FONTS[cls][1]
    left = {"start": x, "middle": x - width / 2, "end": x - width}[el.get("text-anchor", "start")]
    return left, y - ASCENT * size, left + width, y + DESCENT * size, s


def _inside(inner, outer, px=0.0, py=0.0) -> bool:
    return (
        inner[0] >= outer[0] + px
        and inner[1] >= outer[1] + py
        and inner[2] <= outer[2] - px
        and inner[3] <= outer[3] - py
    )


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def layout_problems(document: str) -> list[str]:
    """Every label of an SVG document that overflows its box, crosses a box or another label."""
    ns = {"s": "http://www.w3.org/2000/svg"}
    root = ET.fromstring(document)
    width, height = float(root.get("width")), float(root.get("height"))
    rects = []
    for el in root.iter(f"{{{ns['s']}}}rect"):
        x, y = float(el.get("x", 0)), float(el.get("y", 0))
        w, h = float(el.get("width")), float(el.get("height"))
        if (x, y, w, h) != (0, 0, width, height):  # not the background
            rects.append((x, y, x + w, y + h))
    labels = [_text_box(el) for el in root.iter(f"{{{ns['s']}}}text")]
    out = []
    for t in labels:
        where = f"{t[4]!r}"
        if not _inside(t, (0, 0, width, height), 2, 0):
            out.append(f"{where} leaves the {width:g}x{height:g} canvas")
        for r in rects:
            if _overlap(t, r) and not _inside(t, r, PAD_X, PAD_Y):
                wide = t[2] - t[0] > r[2] - r[0] - 2 * PAD_X
                why = "is wider than" if wide and _overlap(t, r) else "crosses the edge of"
                out.append(f"{where} {why} the box at x={r[0]:g}, y={r[1]:g}")
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            if _overlap(a, b):
                out.append(f"{a[4]!r} overlaps {b[4]!r}")
    return out
