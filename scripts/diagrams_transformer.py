"""Draw the diagrams of lessons 13 and 14 (a transformer block split over ranks, the causal
chunk pairs of ring attention): the drawings only. scripts/make_diagrams.py writes them into
img/ with the others and checks that every label fits."""

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


RANK_FILLS = ["#e3eef9", "#e6f4e7", "#fdf0e3", "#efe3f9"]  # ranks 0-3
RANK_INKS = [HOST, DEV, LINK, "#6a3d9a"]
CELL = 26


def _owner(chunk: int, world: int, layout: str) -> int:
    """The rank holding query chunk `chunk` of 2*world (as d2l.shard_sequence lays them out)."""
    if layout == "contiguous":
        return chunk // 2
    return chunk if chunk < world else 2 * world - 1 - chunk


def _pair_grid(x: int, y: int, layout: str, world: int = 4) -> list[str]:
    """Query chunks down, key chunks across; a causal pair coloured by the rank computing it."""
    out, n = [], 2 * world
    out.append(text(x + n * CELL / 2, y - 30, layout, "label"))
    counts = [0] * world
    for q in range(n):
        out.append(text(x - 8, y + q * CELL + 17, str(q), "small", anchor="end"))
        for k in range(q + 1):
            rank = _owner(q, world, layout)
            counts[rank] += 1
            out.append(box(x + k * CELL, y + q * CELL, CELL, CELL, RANK_INKS[rank],
                           RANK_FILLS[rank], rx=2))  # fmt: skip
            out.append(text(x + k * CELL + CELL / 2, y + q * CELL + 17, str(rank), "small"))
    for k in range(n):
        out.append(text(x + k * CELL + CELL / 2, y - 8, str(k), "small"))
    said = ", ".join(str(c) for c in counts)
    out.append(text(x + n * CELL / 2, y + n * CELL + 24, f"ranks 0-3 compute {said}", "small"))
    return out


def causal_pairs() -> tuple[int, int, str, list[str]]:
    """Lesson 14: the causal chunk pairs of 4 ranks, contiguous against zig-zag."""
    body = [
        text(
            20,
            28,
            "8 causal chunks on 4 ranks: who computes which pair",
            "title",
            anchor="start",
        ),  # fmt: skip
        text(
            20,
            52,
            "rows: query chunks; columns: key chunks; a number is the rank",
            "small",
            anchor="start",
        ),  # fmt: skip
    ]
    body += _pair_grid(60, 110, "contiguous")
    body += _pair_grid(60 + 8 * CELL + 90, 110, "zigzag")
    width = 60 + 8 * CELL + 90 + 8 * CELL + 30
    return width, 110 + 8 * CELL + 40, "Causal chunk pairs, contiguous and zig-zag", body
