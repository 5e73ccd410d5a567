"""Draw the diagrams of lessons 10 and 11 (splitting a model, sharding its memory): the drawings
only. scripts/make_diagrams.py writes them into img/ with the others, in the palette of
diagram_kit.py, and checks that every label fits."""

from __future__ import annotations

from diagram_kit import (
    DEV,
    DEV_FILL,
    HOST,
    HOST_FILL,
    LINK,
    MUTED,
    arrow,
    box,
    link,
    text,
)

PARAM_FILL, GRAD_FILL, OPT_FILL = "#e3eef9", "#fdf0e3", "#efe3f9"
OPT = "#6a3d9a"


def _layer_stack(x, y, w, names, colour, fill, split=None) -> list[str]:
    """A column of layer boxes, top to bottom; `split` shades the half a device owns."""
    out = []
    for i, name in enumerate(names):
        top = y + i * 40
        out.append(box(x, top, w, 32, colour, fill if split is None else "#ffffff", rx=4))
        if split is not None:  # this device's channels: one half of the box
            half = w / 2
            out.append(box(x + split * half, top, half, 32, colour, fill, rx=4))
        out.append(text(x + w / 2, top + 21, name, "small"))
    return out


def three_splits() -> tuple[int, int, str, list[str]]:
    """Lesson 10: by data, by layers, by channels: what each device holds and what it sends."""
    body = [
        text(
            20,
            30,
            "Three ways to split one training step over two devices",
            "title",
            anchor="start",
        )
    ]
    layers = ["layer 1", "layer 2", "layer 3", "layer 4"]
    panels = [
        (20, "by data", "whole model, half of the batch", "gradients: all-reduce once"),
        (300, "by layers", "half of the layers, all of the batch", "activations and their grads"),
        (580, "by channels", "half of every layer, all of the batch", "activations: every layer"),
    ]
    for x, title, holds, sends in panels:
        body.append(text(x + 130, 66, title, "title"))
        body.append(text(x + 130, 86, holds, "small"))
        body.append(box(x, 96, 260, 230, MUTED, "#fafafa"))
        body.append(text(x + 130, 350, "sends: " + sends, "small", colour=LINK))
    for d in range(2):  # data: two full replicas
        x = 40 + d * 120
        body.append(text(x + 50, 120, f"device {d}", "label"))
        body += _layer_stack(x, 132, 100, layers, DEV, DEV_FILL)
        body.append(text(x + 50, 310, f"examples {'1..B/2' if d == 0 else 'B/2+1..B'}", "small"))
    body.append(arrow(142, 210, 158, 210, "link", LINK, 3, both=True))
    body.append(text(400, 120, "device 0", "label"))
    body += _layer_stack(330, 132, 140, layers[:2], DEV, DEV_FILL)
    body.append(text(400, 228, "device 1", "label"))
    body += _layer_stack(330, 240, 140, layers[2:], HOST, HOST_FILL)
    body.append(arrow(490, 180, 490, 240, "link", LINK, 3))
    body.append(arrow(510, 240, 510, 180, "link", LINK, 3))
    body.append(text(522, 200, "h", "code", anchor="start"))
    body.append(text(522, 226, "dh", "code", anchor="start"))
    body.append(text(660, 120, "device 0", "label", colour=DEV))
    body.append(text(780, 120, "device 1", "label", colour=HOST))
    for i, name in enumerate(layers):
        top = 132 + i * 40
        body.append(box(610, top, 100, 32, DEV, DEV_FILL, rx=4))
        body.append(box(730, top, 100, 32, HOST, HOST_FILL, rx=4))
        body.append(text(660, top + 21, f"{name}, half", "small"))
        body.append(text(780, top + 21, f"{name}, half", "small"))
        body.append(link(712, top + 16, 728, top + 16, 5))
    body.append(
        text(
            20,
            390,
            "Devices of one colour hold the same numbers; an orange line is "
            "communication in every step.",
            "small",
            anchor="start",
        )
    )
    return 870, 405, "Splitting by data, by layers and by channels over two devices", body


def combined() -> tuple[int, int, str, list[str]]:
    """Lesson 11: 16 GPUs as 2 data-parallel replicas x 2 pipeline stages x 4 tensor shards."""
    body = [
        text(
            20,
            30,
            "How the splits combine: 16 GPUs = 2 (data) x 2 (layers) x 4 (channels)",
            "title",
            anchor="start",
        )
    ]
    for r in range(2):  # data-parallel replicas (or FSDP shards of one model)
        x0 = 20 + r * 430
        body.append(box(x0, 50, 410, 300, MUTED, "#fafafa"))
        body.append(text(x0 + 205, 72, f"replica {r}: one whole model (data parallel)", "label"))
        for s in range(2):  # pipeline stages, one machine each
            y0 = 90 + s * 130
            body.append(box(x0 + 15, y0, 380, 110, HOST, HOST_FILL))
            layers = "1-12" if s == 0 else "13-24"
            label = f"machine {2 * r + s}: pipeline stage {s} (layers {layers})"
            body.append(text(x0 + 25, y0 + 20, label, "small", anchor="start"))
            for g in range(4):  # tensor-parallel GPUs inside a machine
                gx = x0 + 30 + g * 90
                body.append(box(gx, y0 + 35, 82, 60, DEV, DEV_FILL, rx=6))
                body.append(text(gx + 41, y0 + 60, f"GPU {4 * (2 * r + s) + g}", "small"))
                body.append(text(gx + 41, y0 + 78, "1/4 of each", "small"))
                if g:
                    body.append(link(gx - 7, y0 + 65, gx - 1, y0 + 65, 6))
        body.append(arrow(x0 + 205, 202, x0 + 205, 218, "link", LINK, 3))
    body.append(arrow(420, 280, 460, 280, "link", LINK, 3, both=True))
    body.append(
        text(
            20,
            380,
            "channels (tensor parallel): inside a machine, fastest links "
            "(NVLink), traffic every layer",
            "small",
            anchor="start",
        )
    )
    body.append(
        text(
            20,
            398,
            "layers (pipeline): between machines, one activation per "
            "micro-batch and stage boundary",
            "small",
            anchor="start",
        )
    )
    body.append(
        text(
            20,
            416,
            "data (DDP, or sharded with ZeRO/FSDP): across everything, gradients once per step",
            "small",
            anchor="start",
        )
    )
    return 880, 432, "Data, pipeline and tensor parallelism combined on 16 GPUs", body


def zero_stages() -> tuple[int, int, str, list[str]]:
    """Lesson 11: what each of 4 ranks keeps under data parallelism and ZeRO stages 1-3."""
    body = [text(20, 30, "What each of 4 ranks keeps between steps", "title", anchor="start")]
    rows = [
        ("data parallel", 4, 4, 4),
        ("ZeRO-1: optimizer state", 4, 4, 1),
        ("ZeRO-2: + gradients", 4, 1, 1),
        ("ZeRO-3 / FSDP: + parameters", 1, 1, 1),
    ]
    unit = 16  # one rank's quarter of the parameters; Adam's state is twice as wide
    for j, (name, *counts) in enumerate(rows):
        y = 60 + j * 62
        body.append(text(20, y + 26, name, "label", anchor="start"))
        for rank in range(4):
            x = 250 + rank * 160
            if j == 0:
                body.append(text(x + 4 * unit, 52, f"rank {rank}", "small"))
            styles = [(HOST, PARAM_FILL, 1), (LINK, GRAD_FILL, 1), (OPT, OPT_FILL, 2)]
            parts = zip(counts, styles, strict=True)
            for k, (n, (colour, fill, wide)) in enumerate(parts):
                top, w = y + k * 16, unit * wide
                if n == 4:  # the whole tensor
                    body.append(box(x, top, 4 * w, 12, colour, fill, rx=2))
                else:  # only this rank's quarter, drawn where it sits in the whole
                    body.append(box(x, top, 4 * w, 12, MUTED, "#ffffff", rx=2, dash=True))
                    body.append(box(x + rank * w, top, w, 12, colour, fill, rx=2))
    legend = [
        ("parameters", HOST, PARAM_FILL),
        ("gradients", LINK, GRAD_FILL),
        ("optimizer state (Adam: 2 numbers per parameter)", OPT, OPT_FILL),
    ]
    for i, (name, colour, fill) in enumerate(legend):
        body.append(box(20 + i * 200, 318, 16, 12, colour, fill, rx=2))
        body.append(text(42 + i * 200, 329, name, "small", anchor="start"))
    body.append(
        text(
            20,
            356,
            "A full bar is the whole tensor on every rank; a short bar is the "
            "rank's quarter (its shard).",
            "small",
            anchor="start",
        )
    )
    body.append(
        text(
            20,
            377,
            "ZeRO-3 gathers a layer's parameters just before it needs them, then frees them.",
            "small",
            anchor="start",
        )
    )
    return 900, 392, "Memory kept per rank under data parallelism and ZeRO stages 1 to 3", body
