"""Diagrams of lessons 1-4: devices, where operands live, copies and their roads, the host's
asynchronous queue, pinned memory, saving and loading across devices."""

from __future__ import annotations

from diagram_kit import (
    BAD,
    DEV,
    DEV_FILL,
    GOOD,
    HOST,
    HOST_FILL,
    LINK,
    MUTED,
    WAIT_FILL,
    arrow,
    box,
    chip_grid,
    gpu_card,
    link,
    memory_bar,
    text,
)


def devices() -> tuple[int, int, str, list[str]]:
    """Lesson 1: the CPU device is all cores plus host RAM; each GPU is one device."""
    body = [box(20, 60, 260, 330, HOST, HOST_FILL)]
    body.append(text(150, 88, "Host (the computer)", "title"))
    body.append(text(150, 110, "device 'cpu'", "code", colour=HOST))
    body += chip_grid(60, 130, 4, 2, 36, 10, HOST, "#ffffff")
    body.append(text(150, 238, "a few fast cores: one device", "small"))
    body += memory_bar(40, 256, 220, "host memory (RAM)", HOST, "#ffffff")
    body.append(text(150, 330, "tensors created without a", "small"))
    body.append(text(150, 348, "device argument live here", "small"))
    body += gpu_card(420, 20, "GPU 0", "cuda:0")
    body += gpu_card(420, 240, "GPU 1", "cuda:1")
    body.append(arrow(282, 200, 418, 115, "link", LINK, 3, both=True))
    body.append(arrow(282, 250, 418, 335, "link", LINK, 3, both=True))
    body.append(text(335, 140, "PCIe", "label", colour=LINK))
    body.append(link(540, 214, 540, 236))
    body.append(text(556, 230, "NVLink (if any)", "small", anchor="start"))
    body.append(text(20, 30, "Each box is one PyTorch device", "title", anchor="start"))
    body.append(
        text(
            20,
            458,
            "A tensor lives in exactly one memory; an operation runs on the "
            "device that holds its operands.",
            "small",
            anchor="start",
        )
    )
    return 720, 475, "The CPU device and two GPU devices, each with its own memory", body


def same_device() -> tuple[int, int, str, list[str]]:
    """Lesson 2: operands of one operation must live on one device."""

    def tensor(x, y, name, where, colour, fill):
        return [
            box(x, y, 130, 56, colour, fill),
            text(x + 65, y + 24, name, "code"),
            text(x + 65, y + 44, where, "small"),
        ]

    body = [text(20, 30, "Operands must live on the same device", "title", anchor="start")]
    body += tensor(20, 60, "X", "on 'cuda:0'", DEV, DEV_FILL)
    body += tensor(20, 140, "Y", "on 'cpu'", HOST, HOST_FILL)
    body.append(arrow(152, 88, 250, 112, "bad", BAD))
    body.append(arrow(152, 168, 250, 124, "bad", BAD))
    body.append(box(256, 82, 250, 74, BAD, "#ffffff"))
    body.append(text(381, 104, "X + Y", "code"))
    body.append(text(381, 126, "RuntimeError: expected all", "small", colour=BAD))
    body.append(text(381, 144, "tensors on the same device", "small", colour=BAD))
    body += tensor(20, 240, "X", "on 'cuda:0'", DEV, DEV_FILL)
    body += tensor(20, 320, "Y.to('cuda:0')", "copied first", DEV, DEV_FILL)
    body.append(arrow(152, 268, 250, 292, "good", GOOD))
    body.append(arrow(152, 348, 250, 304, "good", GOOD))
    body.append(box(256, 262, 250, 74, GOOD, DEV_FILL))
    body.append(text(381, 284, "X + Y.to(X.device)", "code"))
    body.append(text(381, 306, "result on 'cuda:0',", "small", colour=GOOD))
    body.append(text(381, 324, "computed by GPU 0", "small", colour=GOOD))
    body.append(
        text(
            20,
            405,
            "PyTorch never copies for you: you decide where data lives.",
            "small",
            anchor="start",
        )
    )
    return 530, 420, "Adding tensors on two devices fails; copy one operand first", body


def copy_link() -> tuple[int, int, str, list[str]]:
    """Lesson 3: memories joined by links of very different speed."""
    body = [text(20, 30, "Where copies go, and how fast the roads are", "title", anchor="start")]
    body.append(box(20, 60, 210, 150, HOST, HOST_FILL))
    body.append(text(125, 86, "Host", "title"))
    body += memory_bar(40, 100, 170, "host RAM", HOST, "#ffffff")
    body.append(text(125, 160, "CPU reads RAM at", "small"))
    body.append(text(125, 178, "~50-200 GB/s", "small"))
    for i, (y, name) in enumerate([(60, "GPU 0"), (260, "GPU 1")]):
        body.append(box(440, y, 210, 150, DEV, DEV_FILL))
        body.append(text(545, y + 26, f"{name} ('cuda:{i}')", "title"))
        body += memory_bar(460, y + 40, 170, "device memory", DEV, "#ffffff")
        body.append(text(545, y + 100, "GPU reads its memory at", "small"))
        body.append(text(545, y + 118, "~0.3-8 TB/s", "small"))
    body.append(arrow(232, 125, 438, 125, "link", LINK, 4, both=True))
    body.append(text(335, 112, "PCIe", "label", colour=LINK))
    body.append(text(335, 148, "~16-64 GB/s", "small"))
    body.append(text(335, 166, "each way", "small"))
    body.append(link(545, 216, 545, 254, 10))
    body.append(text(560, 232, "NVLink / Infinity Fabric", "small", anchor="start"))
    body.append(text(560, 248, "~100-900 GB/s, or via PCIe", "small", anchor="start"))
    body.append(text(20, 250, "X.to('cuda:0')", "code", anchor="start"))
    body.append(text(20, 270, "crosses PCIe: tens of times", "small", anchor="start"))
    body.append(text(20, 288, "slower than the GPU's own", "small", anchor="start"))
    body.append(text(20, 306, "memory, plus a fixed cost", "small", anchor="start"))
    body.append(text(20, 324, "per copy.", "small", anchor="start"))
    body.append(text(20, 364, "X.to('cuda:1')", "code", anchor="start"))
    body.append(text(20, 384, "GPU to GPU: a direct link", "small", anchor="start"))
    body.append(text(20, 402, "where there is one.", "small", anchor="start"))
    body.append(
        text(
            20,
            440,
            "Orders of magnitude only; your hardware differs. Lesson 3 "
            "measures your own copy speed.",
            "small",
            anchor="start",
        )
    )
    return 800, 460, "Host memory and two GPU memories joined by PCIe and NVLink", body


def sync_timeline() -> tuple[int, int, str, list[str]]:
    """Lesson 3: the host queues work and runs ahead until something needs a result."""
    body = [text(20, 30, "Asynchronous launches and the implicit wait", "title", anchor="start")]
    body.append(text(20, 82, "Python", "label", anchor="start"))
    body.append(text(20, 100, "(host)", "small", anchor="start"))
    body.append(text(20, 172, "GPU", "label", anchor="start"))
    body.append(text(20, 190, "(stream)", "small", anchor="start"))
    body.append(arrow(90, 230, 680, 230))
    body.append(text(680, 250, "time", "small", anchor="end"))
    launches = ["A @ B", "relu", "sum"]
    for i, name in enumerate(launches):
        x = 100 + i * 70
        body.append(box(x, 66, 60, 36, HOST, HOST_FILL, rx=4))
        body.append(text(x + 30, 89, name, "code"))
        gx = 130 + i * 130
        body.append(box(gx, 156, 120, 36, DEV, DEV_FILL, rx=4))
        body.append(text(gx + 60, 179, name, "code"))
        body.append(arrow(x + 30, 104, gx + 10, 154, dash=True))
    body.append(box(310, 66, 236, 36, BAD, WAIT_FILL, rx=4))
    body.append(text(428, 89, "s.item(): waits", "code", colour=BAD))
    body.append(box(556, 66, 70, 36, HOST, HOST_FILL, rx=4))
    body.append(text(591, 89, "print", "code"))
    body.append(box(514, 156, 30, 36, LINK, "#fdf0e3", rx=4))
    body.append(text(529, 210, "copy", "small"))
    body.append(arrow(536, 156, 570, 104, "link", LINK))
    body.append(
        text(
            20,
            280,
            "Launching is fast: Python queues the kernels and moves on. "
            "Reading a value (.item(), print,",
            "small",
            anchor="start",
        )
    )
    body.append(
        text(
            20,
            298,
            ".tolist(), .numpy() after .cpu(), if t > 0:) makes the host "
            "wait until the queue reaches it.",
            "small",
            anchor="start",
        )
    )
    return 700, 315, "Host launches kernels asynchronously; .item() makes it wait", body


def pinned() -> tuple[int, int, str, list[str]]:
    """Lesson 3: pageable memory is staged through a pinned buffer; pinned memory is not."""
    body = [text(20, 30, "Pageable versus pinned host memory", "title", anchor="start")]
    rows = [(70, "pageable tensor (default)", True), (200, "pinned tensor: X.pin_memory()", False)]
    for y, label, staged in rows:
        body.append(text(20, y - 10, label, "label", anchor="start"))
        body.append(box(20, y, 150, 60, HOST, HOST_FILL))
        body.append(text(95, y + 27, "X in host RAM", "small"))
        body.append(text(95, y + 45, "(pageable)" if staged else "(page-locked)", "small"))
        body.append(box(480, y, 150, 60, DEV, DEV_FILL))
        body.append(text(555, y + 35, "device memory", "small"))
        if staged:
            body.append(box(250, y, 150, 60, HOST, "#ffffff", dash=True))
            body.append(text(325, y + 27, "pinned staging", "small"))
            body.append(text(325, y + 45, "buffer (driver)", "small"))
            body.append(arrow(172, y + 30, 248, y + 30))
            body.append(text(210, y + 80, "CPU copy", "small"))
            body.append(arrow(402, y + 30, 478, y + 30, "link", LINK, 3))
            body.append(text(440, y + 80, "DMA", "small"))
        else:
            body.append(arrow(172, y + 30, 478, y + 30, "link", LINK, 3))
            body.append(text(325, y + 22, "DMA straight from X", "small"))
            body.append(text(325, y + 52, "non_blocking=True: the host moves on", "small"))
    body.append(
        text(
            20,
            310,
            "Pinning costs host RAM that the OS can no longer swap out: pin "
            "what you copy often, not everything.",
            "small",
            anchor="start",
        )
    )
    return 660, 325, "Copying from pageable memory needs an extra staging copy", body


def save_load() -> tuple[int, int, str, list[str]]:
    """Lesson 4: a state_dict saved on one device and loaded onto another."""
    body = [text(20, 30, "Saving on one device, loading on another", "title", anchor="start")]
    body.append(box(20, 60, 170, 90, DEV, DEV_FILL))
    body.append(text(105, 90, "net on 'cuda:0'", "code"))
    body.append(text(105, 112, "parameters and", "small"))
    body.append(text(105, 128, "buffers in GPU memory", "small"))
    body.append(arrow(192, 105, 268, 105))
    body.append(text(230, 92, "torch.save", "small"))
    body.append(text(230, 125, "(state_dict)", "small"))
    body.append(box(270, 60, 150, 90, MUTED, "#f4f4f4"))
    body.append(text(345, 90, "net.params", "code"))
    body.append(text(345, 112, "each tensor keeps", "small"))
    body.append(text(345, 128, "a device tag", "small"))
    body.append(arrow(422, 105, 498, 105))
    body.append(text(460, 92, "torch.load", "small"))
    body.append(box(500, 60, 230, 90, HOST, HOST_FILL))
    body.append(text(615, 84, "map_location='cpu',", "code"))
    body.append(text(615, 104, "weights_only=True", "code"))
    body.append(text(615, 128, "tensors now in host RAM", "small"))
    body.append(arrow(615, 152, 615, 198))
    body.append(text(605, 180, "net2.load_state_dict(...)", "code", anchor="end"))
    body.append(box(500, 200, 230, 70, HOST, "#ffffff"))
    body.append(text(615, 228, "copied into net2's own", "small"))
    body.append(text(615, 246, "parameters, on net2's device", "small"))
    body.append(text(20, 200, "Without map_location, tensors saved", "small", anchor="start"))
    body.append(text(20, 218, "from 'cuda:0' are loaded back to", "small", anchor="start"))
    body.append(text(20, 236, "'cuda:0': an error on a machine", "small", anchor="start"))
    body.append(text(20, 254, "without that device.", "small", anchor="start"))
    return 750, 290, "A state_dict saved from a GPU and loaded on the CPU with map_location", body
