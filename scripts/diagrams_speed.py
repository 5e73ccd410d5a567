"""Diagrams of lesson 8 (making one device fast): the channels_last memory order, and mixed
precision with loss scaling."""

from __future__ import annotations

from diagram_kit import (
    BAD,
    DEV,
    DEV_FILL,
    HOST,
    HOST_FILL,
    LINK,
    LINK_FILL,
    MUTED,
    arrow,
    box,
    lines,
    text,
)

CHANNELS = [(HOST, HOST_FILL), (DEV, DEV_FILL), (LINK, LINK_FILL)]


def _strip(y, order) -> list[str]:
    """Twelve memory cells, one per number of a 1x3x2x2 tensor, in the given (c, p) order."""
    body = []
    for i, (c, p) in enumerate(order):
        colour, fill = CHANNELS[c]
        body.append(box(20 + 56 * i, y, 56, 36, colour, fill, rx=2))
        body.append(text(48 + 56 * i, y + 23, f"c{c} p{p}", "small"))
    return body


def channels_last() -> tuple[int, int, str, list[str]]:
    """Lesson 8: one tensor of shape (1, 3, 2, 2) in the default order and in channels_last."""
    body = [
        text(20, 30, "channels_last: the same tensor, another order in memory", "title", "start")
    ]
    nchw = [(c, p) for c in range(3) for p in range(4)]
    nhwc = [(c, p) for p in range(4) for c in range(3)]
    body.append(text(20, 70, "default (NCHW): torch.contiguous_format", "code", "start"))
    body += _strip(82, nchw)
    body.append(
        text(
            20, 140, "x.stride() == (12, 4, 2, 1): each channel's pixels together", "small", "start"
        )
    )
    body.append(
        text(20, 186, "x.contiguous(memory_format=torch.channels_last)  (NHWC)", "code", "start")
    )
    body += _strip(198, nhwc)
    body.append(
        text(
            20, 256, "x.stride() == (12, 1, 6, 3): each pixel's channels together", "small", "start"
        )
    )
    body.append(arrow(20, 276, 692, 276, colour=MUTED))
    body.append(text(692, 294, "memory address", "small", "end"))
    body += lines(
        20,
        324,
        [
            "c = channel, p = pixel (h, w). x.shape is (1, 3, 2, 2) both times; only the strides",
            "differ. A convolution combines all channels of each pixel: NHWC keeps them adjacent.",
        ],
    )
    return 712, 356, "The default NCHW order and channels_last (NHWC) for a 1x3x2x2 tensor", body


def amp_loss_scaling() -> tuple[int, int, str, list[str]]:
    """Lesson 8: autocast's precisions, and how GradScaler scales the loss for float16."""
    body = [
        text(20, 30, "Mixed precision: autocast, and loss scaling for float16", "title", "start")
    ]
    top = [
        (20, 170, HOST, HOST_FILL, ["weights in float32", "(what the optimizer", "updates)"]),
        (
            220,
            250,
            DEV,
            DEV_FILL,
            [
                "forward under autocast:",
                "convolutions, matmuls in",
                "bf16/fp16; sums, softmax,",
                "loss in float32",
            ],
        ),
        (500, 120, DEV, DEV_FILL, ["loss", "(float32)"]),
        (650, 130, LINK, LINK_FILL, ["scaler.scale(l)", "= l * S"]),
    ]
    bottom = [
        (
            20,
            230,
            HOST,
            HOST_FILL,
            ["scaler.update(): S / 2 after", "an overflow, S * 2 after", "2000 clean steps"],
        ),
        (
            280,
            230,
            LINK,
            LINK_FILL,
            ["scaler.step(optimizer):", "gradients / S; if any is", "inf or NaN, skip the step"],
        ),
        (
            540,
            240,
            DEV,
            DEV_FILL,
            ["backward: gradients come", "out multiplied by S, so", "small ones survive fp16"],
        ),
    ]
    for row, y, h in ((top, 56, 96), (bottom, 206, 76)):
        for x, w, colour, fill, strings in row:
            body.append(box(x, y, w, h, colour, fill))
            first = y + (h - 18 * (len(strings) - 1)) / 2 + 4
            body += lines(x + w / 2, first, strings, "small", "middle", 18)
    for x1, x2 in ((192, 218), (472, 498), (622, 648)):
        body.append(arrow(x1, 104, x2, 104))
    body.append(arrow(715, 154, 715, 204))
    body.append(arrow(538, 244, 512, 244))
    body.append(arrow(278, 244, 252, 244))
    body.append(arrow(105, 204, 105, 154, colour=BAD, dash=True))
    body.append(text(112, 186, "next step", "small", "start", colour=BAD))
    body += lines(
        20,
        316,
        [
            "bfloat16 keeps float32's exponent range: tiny gradients do not underflow, so it needs",
            "no scaler. float16 (V100, T4, Apple MPS) flushes numbers below about 6e-8 to zero;",
            "the scale S (65536 at first) lifts gradients above that, and is divided out again",
            "before the step.",
        ],
    )
    return 800, 390, "Autocast runs heavy operations in 16 bits; GradScaler scales the loss", body
