"""Draw lesson 12's diagrams (parameter servers, the ring, the hierarchy): the drawings
only. scripts/make_diagrams.py writes them into img/ with the others, in the palette of
diagram_kit.py, and checks that every label fits."""

from __future__ import annotations

from diagram_kit import (
    BAD,
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

SLICE_FILLS = ["#fde0c5", "#d7e8f7", "#dcefd9", "#efdcf2"]  # one colour per key range


def slices(x, y, w, h, fills, labels=None) -> list[str]:
    """A buffer drawn as equal slices side by side, each in its own colour."""
    out, step = [], w / len(fills)
    for i, fill in enumerate(fills):
        out.append(box(x + i * step, y, step, h, MUTED, fill, rx=2))
        if labels:
            out.append(text(x + i * step + step / 2, y + h / 2 + 5, labels[i], "small"))
    return out


def parameter_server() -> tuple[int, int, str, list[str]]:
    """One server carries every byte; k servers holding key ranges share the load."""
    body = [text(20, 30, "Parameter servers: push, sum, pull", "title", anchor="start")]
    # left: one server
    body.append(text(190, 62, "one server", "label"))
    body.append(box(110, 76, 160, 56, HOST, HOST_FILL))
    body.append(text(190, 100, "server", "label"))
    body.append(text(190, 120, "sums every key", "small"))
    for i in range(4):
        x = 20 + i * 90
        body.append(box(x, 230, 80, 50, DEV, DEV_FILL))
        body.append(text(x + 40, 260, f"worker {i}", "small"))
        body.append(arrow(x + 32, 228, 170 + i * 14 - 20, 135, "link", LINK, 2))
        body.append(arrow(190 + i * 14 - 20, 135, x + 48, 228, "arrow", MUTED, 1, dash=True))
    body.append(text(190, 310, "push N bytes, pull N bytes each:", "small"))
    body.append(text(190, 328, "the server's link carries 2kN", "small", colour=BAD))
    # right: one server per key range
    body.append(text(590, 62, "k servers, one key range each", "label"))
    for s in range(4):
        x = 420 + s * 90
        body.append(box(x, 76, 80, 56, HOST, HOST_FILL))
        body.append(text(x + 40, 98, f"server {s}", "small"))
        body += slices(x + 10, 108, 60, 18, [SLICE_FILLS[s]], [f"keys {s}"])
    for i in range(4):
        x = 420 + i * 90
        body.append(box(x, 230, 80, 50, DEV, DEV_FILL))
        body.append(text(x + 40, 248, f"worker {i}", "small"))
        body += slices(x + 8, 256, 64, 16, SLICE_FILLS)
        for s in range(4):
            body.append(arrow(x + 16 + s * 16, 228, 450 + s * 90 + i * 7, 135, "link", LINK, 1))
    body.append(text(590, 310, "slice s goes to server s:", "small"))
    body.append(text(590, 328, "each link carries about 2N", "small", colour=DEV))
    body.append(
        text(
            20,
            370,
            "Solid: push gradients (or slices); dashed: pull sums. In the lesson's code "
            "servers are ranks that also work: 2(k-1)N.",
            "small",
            anchor="start",
        )
    )
    return 800, 390, "One parameter server versus k servers that each hold one key range", body


def ring() -> tuple[int, int, str, list[str]]:
    """Four ranks in a ring, each buffer cut into four chunks; the state after reduce-scatter."""
    title = "Ring all-reduce: reduce-scatter, then all-gather"
    body = [text(20, 30, title, "title", anchor="start")]
    spots = [(110, 70), (390, 70), (390, 240), (110, 240)]
    for r, (x, y) in enumerate(spots):
        body.append(box(x, y, 200, 90, DEV, DEV_FILL))
        body.append(text(x + 100, y + 24, f"rank {r}", "label"))
        done = (r + 1) % 4  # the chunk this rank holds the whole sum of after reduce-scatter
        fills = ["#ffffff"] * 4
        fills[done] = SLICE_FILLS[done]
        labels = ["", "", "", ""]
        labels[done] = "sum"
        body += slices(x + 20, y + 40, 160, 30, fills, labels)
    body.append(arrow(312, 115, 388, 115, "link", LINK, 3))
    body.append(arrow(490, 162, 490, 238, "link", LINK, 3))
    body.append(arrow(388, 285, 312, 285, "link", LINK, 3))
    body.append(arrow(210, 238, 210, 162, "link", LINK, 3))
    body.append(text(620, 90, "Every step, every rank", "small", anchor="start"))
    body.append(text(620, 108, "sends one chunk (N/k)", "small", anchor="start"))
    body.append(text(620, 126, "to its right neighbour", "small", anchor="start"))
    body.append(text(620, 144, "and adds the one it gets.", "small", anchor="start"))
    body.append(text(620, 190, "After k-1 steps rank i", "small", anchor="start"))
    body.append(text(620, 208, "holds the sum of chunk i+1;", "small", anchor="start"))
    body.append(text(620, 226, "k-1 more steps pass the", "small", anchor="start"))
    body.append(text(620, 244, "sums on (all-gather).", "small", anchor="start"))
    body.append(
        text(
            20,
            370,
            "Each rank sends 2(k-1) chunks of N/k bytes: 2(k-1)/k N in all, "
            "whatever k is, and every link works at once.",
            "small",
            anchor="start",
        )
    )
    return 820, 390, "Four ranks in a ring; after reduce-scatter rank i holds chunk i+1's sum", body


def hierarchy() -> tuple[int, int, str, list[str]]:
    """Two machines of two ranks: reduce inside, ring across the slow link, broadcast inside."""
    body = [text(20, 30, "Hierarchical all-reduce on two machines", "title", anchor="start")]
    for m, x in enumerate((20, 440)):
        body.append(box(x, 60, 300, 200, HOST, HOST_FILL))
        body.append(text(x + 150, 84, f"machine {m}", "label"))
        for j in range(2):
            r = 2 * m + j
            body.append(box(x + 20 + j * 150, 110, 110, 60, DEV, DEV_FILL))
            body.append(text(x + 75 + j * 150, 136, f"rank {r}", "label"))
            body.append(text(x + 75 + j * 150, 156, "leader" if j == 0 else "", "small"))
        body.append(link(x + 132, 140, x + 168, 140, 8))
        body.append(text(x + 150, 200, "fast link inside", "small"))
        body.append(text(x + 150, 218, "(NVLink, PCIe; here lo)", "small"))
    body.append(arrow(95, 172, 95, 290, "arrow", MUTED, 1, dash=True))
    body.append(arrow(515, 172, 515, 290, "arrow", MUTED, 1, dash=True))
    body.append(link(95, 300, 515, 300, 4))
    body.append(text(305, 290, "slow link between machines (Ethernet; here veth + tc)", "small"))
    steps = [
        "1. reduce inside: rank 1 sends to rank 0, rank 3 to rank 2 (fast)",
        "2. the leaders (0 and 2) all-reduce over the slow link",
        "3. broadcast inside: each leader sends the sum to its machine (fast)",
    ]
    for i, s in enumerate(steps):
        body.append(text(20, 344 + 20 * i, s, "label", anchor="start"))
    body.append(
        text(
            20,
            418,
            "Only leaders cross between machines, so the slow link carries one copy "
            "of each machine's data, not one per rank.",
            "small",
            anchor="start",
        )
    )
    return 760, 436, "Two machines of two ranks each: reduce inside, across, broadcast", body
