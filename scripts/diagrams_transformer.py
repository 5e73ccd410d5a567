"""Draw the diagram of lesson 13 (a transformer block split over ranks): the drawing only.
scripts/make_diagrams.py writes it into img/ with the others and checks that every label fits."""

from __future__ import annotations

from diagram_kit import DEV, DEV_FILL, HOST, HOST_FILL, LINK, MUTED, arrow, box, text

W, H, GAP = 104, 46, 28  # one step's box, and the room between two boxes for an arrow


def _row(y: int, steps: list[tuple[str, str, bool]], collectives: dict[int, str]) -> list[str]:
    """Boxes left to right, (two lines of label, split over ranks?); a collective's name above
    the arrow that enters box i."""
    out = []
    for i, (top, bottom, split) in enumerate(steps):
        x = 20 + i * (W + GAP)
        colour, fill = (DEV, DEV_FILL) if split else (HOST, HOST_FILL)
        out.append(box(x, y, W, H, colour, fill, rx=6))
        out.append(text(x + W / 2, y + 19, top, "small"))
        out.append(text(x + W / 2, y + 36, bottom, "small"))
        if i:
            out.append(arrow(x - GAP + 2, y + H / 2, x - 2, y + H / 2))
        if i in collectives:
            out.append(text(x - GAP / 2, y - 8, collectives[i], "small", colour=LINK))
    return out


def tp_sp_block() -> tuple[int, int, str, list[str]]:
    """Lesson 13: the attention half of a block under tensor and under sequence parallelism."""
    body = [
        text(20, 28, "The attention half of a block on rank r of k", "title", anchor="start"),
        text(
            20,
            62,
            "tensor parallel: the same whole sequence on every rank",
            "label",
            anchor="start",
        ),  # fmt: skip
        text(
            20,
            172,
            "sequence parallel: the norm and the residual on T/k positions",
            "label",
            anchor="start",
        ),  # fmt: skip
    ]
    tp = [
        ("input X", "all T, whole", False),
        ("LayerNorm", "all T, whole", False),
        ("qkv", "my H/k heads", True),
        ("attention", "my H/k heads", True),
        ("proj", "my rows", True),
        ("X + output", "all T, whole", False),
    ]
    body += _row(90, tp, {2: "f", 5: "g: all-reduce"})
    sp = [
        ("input X", "my T/k", True),
        ("LayerNorm", "my T/k", True),
        ("qkv", "my H/k heads", True),
        ("attention", "my H/k heads", True),
        ("proj", "my rows", True),
        ("X + output", "my T/k", True),
    ]
    body += _row(200, sp, {2: "all-gather", 5: "reduce-scatter"})
    body.append(box(20, 268, 14, 14, HOST, HOST_FILL, rx=2))
    body.append(text(42, 280, "whole on every rank", "small", anchor="start"))
    body.append(box(200, 268, 14, 14, DEV, DEV_FILL, rx=2))
    body.append(text(222, 280, "split over the ranks", "small", anchor="start"))
    body.append(
        text(
            20,
            306,
            "the MLP half is the same with fc1 for qkv and attention, fc2 for proj",
            "small",
            anchor="start",
            colour=MUTED,
        )  # fmt: skip
    )
    return 20 + 6 * W + 5 * GAP + 20, 320, "A transformer block under TP and SP", body
