"""Diagrams of lessons 5-7: data parallelism by hand, nn.DataParallel's step, DDP's gradient
buckets, torchrun's processes and ranks, and an elastic restart."""

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
    WAIT_FILL,
    arrow,
    box,
    lines,
    text,
)

NEUTRAL_FILL = "#f4f4f4"


def data_parallel() -> tuple[int, int, str, list[str]]:
    """Lesson 5: split the minibatch, backpropagate per device, allreduce, update every replica."""
    body = [text(20, 30, "Data parallelism: one training step on k devices", "title", "start")]
    body.append(box(230, 50, 260, 40, MUTED, NEUTRAL_FILL))
    body.append(text(360, 76, "minibatch X, y: B examples"))
    body.append(text(500, 76, "split_batch", "code", "start", colour=MUTED))
    for i, (x, name) in enumerate([(20, "0"), (250, "1"), (500, "k-1")]):
        body.append(arrow(360, 92, x + 100, 124))
        body.append(box(x, 126, 200, 132, DEV, DEV_FILL))
        body.append(text(x + 100, 150, f"device {name}", "title"))
        shard = "shard 0: about B/k examples" if i == 0 else f"shard {name}"
        body += lines(
            x + 100,
            174,
            [shard, "its own replica of the", "parameters; summed loss"],
            anchor="middle",
        )
        body.append(
            text(x + 100, 234, f"backward: g{name}" if i < 2 else "backward: g(k-1)", "code")
        )
        body.append(arrow(x + 100, 260, x + 100, 286))
    body.append(text(475, 196, "…", "title", colour=MUTED))
    body.append(box(20, 288, 680, 40, LINK, LINK_FILL))
    body.append(text(360, 314, "allreduce: every device gets g = g0 + g1 + … + g(k-1)"))
    body.append(arrow(360, 330, 360, 352))
    body.append(box(20, 354, 680, 40, DEV, DEV_FILL))
    body.append(text(360, 380, "every replica: params -= lr * g / B    (B: the whole minibatch)"))
    body.append(
        text(
            20,
            424,
            "Only gradients cross between devices. The replicas start equal and apply the same "
            "update, so they stay equal.",
            "small",
            "start",
        )
    )
    return 720, 440, "Data parallelism: split, backpropagate per device, allreduce, update", body


def dataparallel_step() -> tuple[int, int, str, list[str]]:
    """Lesson 6: what nn.DataParallel does in every training step, on two GPUs."""
    body = [text(20, 30, "nn.DataParallel: one training step on two GPUs", "title", "start")]
    cols = {0: 250, 1: 520}  # left edge of each GPU's column
    for g, x in cols.items():
        body.append(box(x, 50, 240, 404, DEV, DEV_FILL))
        body.append(text(x + 120, 76, f"GPU {g} ('cuda:{g}')", "title"))
    rows = [  # (call, what it does, GPU 0's cell, GPU 1's cell, arrow between them)
        ("scatter", "split the batch", "chunk 0 of X, y", "chunk 1 of X, y", "right"),
        ("replicate", "copy the model", "net (the original)", "replica of net", "right"),
        ("parallel_apply", "a thread per GPU", "forward on chunk 0", "forward on chunk 1", ""),
        ("gather", "outputs to GPU 0", "outputs, then loss", "outputs of chunk 1", "left"),
        ("backward", "gradients flow back", "net's .grad: the sum", "replica's gradients", "left"),
        ("optimizer.step()", "on GPU 0 only", "update net", "replica thrown away", ""),
    ]
    for i, (call, what, cell0, cell1, direction) in enumerate(rows):
        y = 92 + i * 60
        body.append(text(20, y + 20, call, "code", "start"))
        body.append(text(20, y + 38, what, "small", "start"))
        for g, cell in ((0, cell0), (1, cell1)):
            dashed = g == 1 and i == len(rows) - 1
            body.append(box(cols[g] + 14, y, 212, 44, DEV, "#ffffff", rx=4, dash=dashed))
            body.append(
                text(cols[g] + 120, y + 27, cell, "small", colour=MUTED if dashed else None)
            )
        if direction == "right":
            body.append(arrow(cols[0] + 228, y + 22, cols[1] + 12, y + 22, "link", LINK, 3))
        elif direction == "left":
            body.append(arrow(cols[1] + 12, y + 22, cols[0] + 228, y + 22, "link", LINK, 3))
    body += lines(
        20,
        480,
        [
            "Every step copies the model to each GPU again and gathers on GPU 0; one Python",
            "process drives all GPUs. DistributedDataParallel (lesson 7): one process per GPU.",
        ],
    )
    return 780, 510, "What nn.DataParallel does in each step: scatter, replicate, gather", body


def _segment(x1, x2, y, label, colour, fill, cls="small", dash=False) -> list[str]:
    """A labelled bar from x1 to x2 on a timeline row at height y."""
    return [
        box(x1, y, x2 - x1, 30, colour, fill, rx=4, dash=dash),
        text((x1 + x2) / 2, y + 20, label, cls),
    ]


def ddp_buckets() -> tuple[int, int, str, list[str]]:
    """Lesson 7: all-reducing each bucket as soon as backward has filled it."""
    body = [
        text(20, 30, "Gradient buckets: communication overlaps the backward pass", "title", "start")
    ]
    layers = [(150, "layer 4"), (230, "layer 3"), (310, "layer 2"), (390, "layer 1")]
    scenarios = [
        (64, "one all-reduce after backward (lesson 5)", [(470, 650, "all-reduce every gradient")]),
        (194, "DDP: one all-reduce per bucket", [(310, 420, "bucket 0"), (470, 540, "bucket 1")]),
    ]
    for y, name, reductions in scenarios:
        body.append(text(20, y + 10, name, "label", "start"))
        body.append(text(20, y + 42, "computation", "small", "start"))
        body.append(text(20, y + 82, "communication", "small", "start"))
        for x, label in layers:
            body += _segment(x, x + 80, y + 22, label, DEV, DEV_FILL)
        for x1, x2, label in reductions:
            body += _segment(x1, x2, y + 62, label, LINK, LINK_FILL)
        end = reductions[-1][1]
        body += _segment(end, end + 110, y + 22, "optimizer step", HOST, HOST_FILL)
    body.append(arrow(150, 318, 780, 318))
    body.append(text(780, 336, "time", "small", "end"))
    body.append(arrow(540, 306, 650, 306, colour=BAD, both=True))
    body.append(text(595, 298, "saved", "small", colour=BAD))
    body += lines(
        20,
        364,
        [
            "Backward produces gradients from the last layer to the first. DDP groups them in",
            "that order into buckets (about 25 MB each: bucket_cap_mb) and starts each bucket's",
            "all-reduce as soon as its last gradient is written. Here bucket 0 = layers 4 and 3.",
        ],
    )
    return 800, 420, "DDP all-reduces gradient buckets while backward is still running", body


def _process(x, y, rank, local_rank) -> list[str]:
    """One worker process started by torchrun, with the variables it reads and its GPU."""
    return [
        box(x, y, 160, 112, DEV, "#ffffff", rx=6),
        text(x + 80, y + 22, "worker process", "label"),
        text(x + 80, y + 44, f"RANK={rank}", "code"),
        text(x + 80, y + 64, f"LOCAL_RANK={local_rank}", "code"),
        text(x + 80, y + 86, "WORLD_SIZE=4", "code"),
        text(x + 80, y + 104, f"drives cuda:{local_rank}", "small"),
    ]


def torchrun_processes() -> tuple[int, int, str, list[str]]:
    """Lesson 7: two machines, a torchrun agent on each, four ranks, one rendezvous."""
    body = [text(20, 30, "torchrun: processes, ranks and the rendezvous", "title", "start")]
    body.append(box(250, 48, 300, 70, HOST, "#ffffff"))
    body.append(text(400, 72, "rendezvous (c10d store)", "label"))
    body.append(text(400, 94, "--rdzv-endpoint HOST:PORT", "code"))
    body.append(text(400, 111, "agents meet; ranks handed out", "small"))
    for n, x in enumerate((20, 420)):
        body.append(box(x, 150, 380, 250, HOST, HOST_FILL))
        body.append(text(x + 190, 174, f"machine {n}: --node-rank {n}", "title"))
        body.append(box(x + 20, 188, 340, 36, HOST, "#ffffff", rx=6))
        body.append(text(x + 190, 211, "torchrun agent: starts and watches", "small"))
        body.append(
            arrow(
                x + 350 - 330 * n,
                186,
                400 + (n - 0.5) * 140,
                120,
                colour=HOST,
                both=True,
                dash=True,
            )
        )
        for j in range(2):
            body += _process(x + 20 + j * 180, 240, 2 * n + j, j)
            body.append(arrow(x + 100 + j * 180, 226, x + 100 + j * 180, 238, colour=HOST))
    body.append(arrow(362, 330, 438, 330, "link", LINK, 3, both=True))
    body.append(
        text(400, 420, "all-reduce between all four ranks: NCCL or gloo", "small", colour=LINK)
    )
    body += lines(
        20,
        450,
        [
            "torchrun --nnodes 2 --nproc-per-node 2 ... on each machine: 2 x 2 = 4 processes,",
            "ranks 0-3. Each reads RANK, LOCAL_RANK and WORLD_SIZE from its environment.",
        ],
    )
    return 820, 490, "torchrun on two machines: agents, a rendezvous store, four ranks", body


def torchrun_restarts() -> tuple[int, int, str, list[str]]:
    """Lesson 7: a worker dies, the agent stops the rest, a new rendezvous, resume from disk."""
    body = [
        text(20, 30, "An elastic restart: one worker dies, every worker restarts", "title", "start")
    ]
    for r, y in ((0, 70), (1, 130)):
        body.append(text(20, y + 20, f"rank {r}", "label", "start"))
        for e, x in enumerate((90, 180, 270)):
            body += _segment(x, x + 80, y, f"epoch {e + 1}", DEV, DEV_FILL)
        if r == 0:
            for x in (170, 260, 350):
                body.append(box(x - 6, y - 18, 12, 12, HOST, HOST, rx=2))
            body += _segment(360, 420, y, "stopped", MUTED, WAIT_FILL)
        else:
            body += _segment(360, 420, y, "killed", BAD, WAIT_FILL)
        body += _segment(540, 620, y, "epoch 4", DEV, DEV_FILL)
        body += _segment(630, 710, y, "epoch 5", DEV, DEV_FILL)
    body.append(box(430, 64, 100, 102, HOST, HOST_FILL, rx=4))
    body += lines(480, 90, ["new", "rendezvous,", "load the", "checkpoint"], "small", "middle", 18)
    body.append(text(360, 47, "checkpoint after each epoch (rank 0, atomic)", "small", "end"))
    body.append(arrow(90, 186, 720, 186))
    body.append(text(720, 204, "time", "small", "end"))
    body += lines(
        20,
        236,
        [
            "With --max-restarts N the agent answers a failed worker by stopping the others,",
            "holding a new rendezvous and starting all of them again, up to N times; then the",
            "job fails.",
            "The script must resume from its last checkpoint, so epochs 1-3 are not repeated.",
        ],
    )
    return 740, 310, "torchrun restarts every worker after a failure; they resume from disk", body
