"""ResNet-18 on Fashion-MNIST as fast as one GPU allows: each change timed alone, then trained.

    python benchmarks/resnet_fast.py [--rows 1,2,...] [--steps 40] [--epochs 10] [--seeds 0,1,2]
                                     [--train ROW] [--limit N] [--device DEV] [--json PATH]

Part 1, the table. Every row is lesson 6's network (d2l.resnet18) on the whole training set held
on the device as uint8 (shuffled there once per epoch), and adds one change to the row before it.
Each row is timed over --steps training steps after a warm-up (which includes any compilation or
graph capture, timed apart), with the device synchronised only at both ends; s/epoch is the time
60,000 images take at that rate. Rows that need CUDA are skipped elsewhere and say so.

Part 2, the recipe. The row named by --train (default: the fastest row that ran) trains from
scratch --epochs epochs per seed in --seeds, with batch 1000 (60 steps, every image every epoch),
SGD with Nesterov momentum, weight decay, label smoothing, and a linear warm-up then cosine decay
of the learning rate. Each epoch's training is timed on its own (synchronised at its ends); the
test accuracy is measured after every epoch, outside the timed part.

Prints both tables and writes them to --json. The fraction of peak divides the FLOPs counted by
torch.utils.flop_counter (3 x the forward pass) by the time, then by the data-sheet dense bf16
peak of d2l_gpu.perf.PEAK_TFLOPS (None for a GPU not listed, and on a CPU).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import d2l_gpu as d2l  # noqa: E402

MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST's training pixels, scaled to [0, 1]
BASE_LR, BASE_BATCH, WEIGHT_DECAY, SMOOTHING = 0.1, 256, 5e-4, 0.1


@dataclass(frozen=True)
class Setup:
    """One row: how the training step is built."""

    batch: int = 256
    read_loss: bool = True  # loss.item() every step, as the book's loop does
    channels_last: bool = False
    bf16: bool = False
    fused: bool = False  # SGD(fused=True): one kernel for all parameters
    compile: str | None = None  # torch.compile mode: "default", "reduce-overhead"
    graph: bool = False  # the whole step (forward, backward, update) captured in a CUDA graph


FUSED = Setup(1000, read_loss=False, channels_last=True, bf16=True, fused=True)  # row 6
ROWS = [
    ("lesson 6's step: fp32, batch 256, loss read every step", Setup()),
    ("+ no loss read in the step", Setup(read_loss=False)),
    ("+ channels_last", Setup(read_loss=False, channels_last=True)),
    ("+ bf16 autocast", Setup(read_loss=False, channels_last=True, bf16=True)),
    ("+ batch 1000, lr scaled", replace(FUSED, fused=False)),
    ("+ fused SGD", FUSED),
    ("+ torch.compile", replace(FUSED, compile="default")),
    ("+ CUDA graphs by compile (reduce-overhead)", replace(FUSED, compile="reduce-overhead")),
    ("row 6 + the whole step in one CUDA graph", replace(FUSED, graph=True)),
    ("row 7 + the whole step in one CUDA graph", replace(FUSED, compile="default", graph=True)),
]


def resnet18(device) -> torch.nn.Module:
    """Lesson 6's network, its lazy layers given their shapes, initialised as lesson 6 does."""
    net = d2l.materialize(d2l.resnet18(10, 1).to(device), (1, 1, 28, 28), device)
    net.apply(d2l.init_weights)
    return net


def lr_at(i: int, total: int, peak: float) -> float:
    """Linear warm-up over the first 10% of steps, then cosine decay to zero."""
    warm = max(1, total // 10)
    if i < warm:
        return peak * (i + 1) / warm
    return 0.5 * peak * (1 + math.cos(math.pi * (i - warm) / max(1, total - warm)))


class Trainer:
    """A network, its optimizer and one training step, built as `setup` says."""

    def __init__(self, setup: Setup, device: torch.device, example_X, example_y, seed: int = 0):
        torch.manual_seed(seed)
        self.setup, self.device = setup, device
        self.net = resnet18(device)
        if setup.channels_last:
            self.net.to(memory_format=torch.channels_last)
        self.peak_lr = BASE_LR * setup.batch / BASE_BATCH
        # a tensor learning rate can change between replays of a captured update
        lr = torch.tensor(self.peak_lr, device=device) if setup.graph else self.peak_lr
        options = {"momentum": 0.9, "nesterov": True, "weight_decay": WEIGHT_DECAY}
        self.opt = torch.optim.SGD(self.net.parameters(), lr, fused=setup.fused or None, **options)
        self.forward = self._loss
        if setup.compile:
            self.forward = torch.compile(self._loss, mode=setup.compile)
        self.start = {k: v.detach().clone() for k, v in self.net.state_dict().items()}
        self.graph = self._capture(example_X, example_y) if setup.graph else None

    def _loss(self, X, y):
        X = ((X.float() / 255 - MEAN) / STD).unsqueeze(1)
        if self.setup.channels_last:
            X = X.contiguous(memory_format=torch.channels_last)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.setup.bf16):
            return F.cross_entropy(self.net(X), y, label_smoothing=SMOOTHING)

    def _eager_step(self, X, y):
        self.opt.zero_grad(set_to_none=True)
        if self.setup.compile == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        loss = self.forward(X, y)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def _capture(self, X, y):
        """Warm up on a side stream, then record one whole step into a CUDA graph."""
        self.X, self.y = X.clone(), y.clone()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(3):
                self._eager_step(self.X, self.y)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        self.opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            self.loss = self.forward(self.X, self.y)
            self.loss.backward()
            self.opt.step()
        return graph

    def reset(self, seed: int) -> None:
        """Fresh weights (seeded) and optimizer state, in place: a captured graph stays valid."""
        torch.manual_seed(seed)
        fresh = resnet18(torch.device("cpu")).state_dict()
        with torch.no_grad():
            for k, v in self.net.state_dict().items():
                v.copy_(fresh[k])
            for state in self.opt.state.values():
                state["momentum_buffer"].zero_()  # with dampening 0, step 1 then equals a fresh one

    def step(self, X, y, lr: float):
        """One update with learning rate `lr`; the loss stays on the device."""
        group = self.opt.param_groups[0]
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr
        if self.graph is None:
            loss = self._eager_step(X, y)
        else:
            self.X.copy_(X)
            self.y.copy_(y)
            self.graph.replay()
            loss = self.loss
        return loss.item() if self.setup.read_loss else loss

    @torch.no_grad()
    def accuracy(self, X, y) -> float:
        """Test accuracy of the network as it is, in eval mode, batches of 2000."""
        self.net.eval()
        right = torch.zeros((), device=self.device)
        for i in range(0, len(X), 2000):
            Xb = ((X[i : i + 2000].float() / 255 - MEAN) / STD).unsqueeze(1)
            if self.setup.channels_last:
                Xb = Xb.contiguous(memory_format=torch.channels_last)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.setup.bf16):
                right += (self.net(Xb).argmax(1) == y[i : i + 2000]).sum()
        self.net.train()
        return right.item() / len(X)


def sync(device: torch.device) -> float:
    """Wait for the device, then read the clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def load(device: torch.device, limit: int | None):
    """Fashion-MNIST as uint8 images and int64 labels on `device` (the first `limit` of each)."""
    raw = d2l.read_fashion_mnist()
    n = limit or len(raw["train_labels"])
    on = {k: v[:n].to(device) for k, v in raw.items()}
    return (on["train_images"], on["train_labels"].long(), on["test_images"],
            on["test_labels"].long())  # fmt: skip


def time_row(setup: Setup, device, Xtr, ytr, steps: int, warmup: int) -> dict:
    """Images per second of `setup` over `steps` steps after `warmup` steps (compile included)."""
    b = setup.batch
    batches = [(Xtr[i * b : (i + 1) * b], ytr[i * b : (i + 1) * b]) for i in range(len(Xtr) // b)]
    if not batches:
        raise ValueError(f"--limit {len(Xtr)} is smaller than one batch of {b}")
    begin = sync(device)
    trainer = Trainer(setup, device, *batches[0])
    for i in range(warmup):
        trainer.step(*batches[i % len(batches)], trainer.peak_lr)
    start = sync(device)
    for i in range(steps):
        trainer.step(*batches[i % len(batches)], trainer.peak_lr)
    end = sync(device)
    per_sec = steps * b / (end - start)
    return {"images_per_sec": per_sec, "sec_per_epoch": 60_000 / per_sec,
            "warmup_s": start - begin}  # fmt: skip


def train(setup: Setup, device, data, epochs: int, seeds: list[int]) -> list[dict]:
    """Train `setup` from scratch per seed: per-epoch seconds and test accuracy."""
    Xtr, ytr, Xte, yte = data
    b = setup.batch
    steps = len(Xtr) // b  # 60 at batch 1000: every image, every epoch
    trainer = Trainer(setup, device, Xtr[:b], ytr[:b])
    out = []
    for seed in seeds:
        trainer.reset(seed)
        gen = torch.Generator(device).manual_seed(seed)
        secs, accs, i = [], [], 0
        for _ in range(epochs):
            start = sync(device)
            order = torch.randperm(len(Xtr), device=device, generator=gen)
            X, y = Xtr[order], ytr[order]  # shuffled on the device, once per epoch
            for j in range(steps):
                lr = lr_at(i, epochs * steps, trainer.peak_lr)
                trainer.step(X[j * b : (j + 1) * b], y[j * b : (j + 1) * b], lr)
                i += 1
            secs.append(sync(device) - start)
            accs.append(trainer.accuracy(Xte, yte))
        out.append({"seed": seed, "test_acc": accs[-1], "accs": accs, "epoch_s": secs,
                    "median_epoch_s": statistics.median(secs)})  # fmt: skip
    return out


def flops_per_image() -> float:
    """Training FLOPs of one image (forward and backward), counted on shapes."""
    net = d2l.materialize(d2l.resnet18(10, 1), (1, 1, 28, 28))
    X, y = torch.zeros(2, 1, 28, 28), torch.zeros(2, dtype=torch.long)
    return d2l.training_flops(net, X, y) / 2


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", default=",".join(str(i + 1) for i in range(len(ROWS))))
    p.add_argument("--steps", type=int, default=40, help="timed steps per row")
    p.add_argument("--warmup", type=int, default=8, help="untimed steps per row first")
    p.add_argument("--epochs", type=int, default=10, help="part 2: epochs per seed (0: skip)")
    p.add_argument("--seeds", default="0,1,2", help="part 2: comma-separated seeds")
    p.add_argument("--train", type=int, help="part 2: the row to train (default: fastest)")
    p.add_argument("--limit", type=int, help="training and test examples (a smoke run)")
    p.add_argument("--device", default=None, help="default: d2l.try_gpu()")
    p.add_argument("--json", type=Path, default=Path("build/resnet_fast.json"))
    args = p.parse_args(argv)
    try:
        args.rows = [int(r) for r in args.rows.split(",")]
        args.seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        p.error("--rows and --seeds take comma-separated whole numbers, e.g. --rows 1,2,5")
    asked = args.rows + ([args.train] if args.train is not None else [])
    bad = [r for r in asked if not 1 <= r <= len(ROWS)]
    if bad:
        p.error(f"--rows/--train: no row {bad[0]}; the rows are 1 to {len(ROWS)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device) if args.device else d2l.try_gpu()
    data = load(device, args.limit)
    fpi = flops_per_image()
    peak = d2l.peak_tflops(device) if device.type == "cuda" else None
    rows = []
    print(f"{'row':<58} {'s/epoch':>8} {'images/s':>10} {'of peak':>8} {'warm-up s':>9}")
    for r in args.rows:
        name, setup = ROWS[r - 1]
        row = {"row": r, "name": name, "setup": asdict(setup)}
        if (setup.graph or setup.compile == "reduce-overhead") and device.type != "cuda":
            row["skipped"] = "CUDA graphs need a CUDA device"
        else:
            try:
                row |= time_row(setup, device, data[0], data[1], args.steps, args.warmup)
                tflops = fpi * row["images_per_sec"] / 1e12
                row["fraction_of_peak"] = tflops / peak if peak else None
            except Exception as e:  # noqa: BLE001 - recorded in the table; the next row goes on
                row["error"] = f"{type(e).__name__}: {e}"[:500]
        rows.append(row)
        if "images_per_sec" in row:
            frac = f"{row['fraction_of_peak']:.1%}" if row["fraction_of_peak"] else "-"
            print(f"{r:>2} {name:<55} {row['sec_per_epoch']:>8.2f} {row['images_per_sec']:>10,.0f} "
                  f"{frac:>8} {row['warmup_s']:>9.1f}", flush=True)  # fmt: skip
        else:
            print(f"{r:>2} {name:<55} {row.get('skipped') or row['error']}", flush=True)
    timed = [row for row in rows if "images_per_sec" in row]
    fastest = min(timed, key=lambda x: x["sec_per_epoch"])["row"] if timed else None
    runs, pick = [], args.train or fastest
    if args.epochs and pick:
        setup = replace(ROWS[pick - 1][1], read_loss=False)
        runs = train(setup, device, data, args.epochs, args.seeds)
        for run in runs:
            print(f"row {pick}, seed {run['seed']}: test acc {run['test_acc']:.4f} after "
                  f"{args.epochs} epochs, median {run['median_epoch_s']:.3f} s/epoch "
                  f"(each: {', '.join(f'{s:.2f}' for s in run['epoch_s'])})")  # fmt: skip
    report = {"device": str(device), "name": d2l.devices_report().splitlines()[1:3],
              "torch": torch.__version__, "flops_per_image": fpi, "peak_tflops": peak,
              "limit": args.limit, "rows": rows, "trained_row": pick, "epochs": args.epochs,
              "runs": runs}  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
