"""ResNet-18 on Fashion-MNIST: the book's pipeline against the d2l_gpu fast path, same run.

    python benchmarks/bench_resnet.py [--profile quick|full] [--steps N] [--limit N] [--json PATH]

Book-style: a per-sample Dataset converting each image, a DataLoader with 4 workers, the model in
fp32 NCHW, the loss read back (.item()) every step. Fast path: the data resident on the device
(d2l.load_data_fashion_mnist(device=...)), channels_last, bf16 autocast (fp16 with a GradScaler
where bf16 is missing), no per-step sync, and torch.compile on a GPU.

quick (default without an accelerator; under 2 minutes on a 2-core CPU): the input-pipeline rate
over --limit training examples and --steps timed training steps of each path. full (default with
one): --epochs epochs of each path with test accuracy. Both print a table with the ratios, the
FLOPs of one training step (torch.utils.flop_counter) and, on a GPU in the PEAK_TFLOPS table of
d2l_gpu.perf, the fraction of data-sheet peak reached; the same goes to --json as JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import d2l_gpu as d2l  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options; the defaults depend on the profile."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--profile", choices=["quick", "full"], default=d2l.profile())
    p.add_argument("--epochs", type=int, default=10, help="full: epochs per path")
    p.add_argument("--steps", type=int, default=3, help="quick: timed training steps per path")
    p.add_argument("--limit", type=int, default=None, help="training examples (quick: 10000)")
    p.add_argument("--batch-size", type=int, default=None, help="quick: 64, full: 256")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument(
        "--workers",
        type=int,
        default=min(4, os.cpu_count() or 1),
        help="book-style DataLoader workers (the book: 4; at most the CPU count)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--constant-lr", action="store_true", help="full: no cosine decay")
    p.add_argument("--no-compile", action="store_true", help="fast path without torch.compile")
    p.add_argument("--json", type=Path, default=ROOT / "build" / "bench_resnet.json")
    args = p.parse_args(argv)
    quick = args.profile == "quick"
    args.limit = args.limit or (10_000 if quick else None)
    args.batch_size = args.batch_size or (64 if quick else 256)
    return args


def machine(device: torch.device) -> dict:
    """What ran the benchmark: device name, torch version, date."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    return {
        "date": datetime.date.today().isoformat(),
        "device": str(device),
        "device_name": name or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "torch_threads": torch.get_num_threads(),
    }


def pipelines(args, device) -> dict:
    """Examples/s of one pass of the book-style loader and of d2l_gpu's resident batches."""
    book, _ = d2l.load_data_book_style(args.batch_size, limit=args.limit, num_workers=args.workers)
    fast, _ = d2l.load_data_fashion_mnist(args.batch_size, limit=args.limit, device=device, seed=0)
    d2l.examples_per_second(fast, device)  # warm-up: first use of the device
    rates = {
        "book": d2l.examples_per_second(book, device),
        "d2l_gpu": d2l.examples_per_second(fast, device),
    }
    return {"examples": len(fast.y), **rates, "ratio": rates["d2l_gpu"] / rates["book"]}


PATHS = {  # name -> (book-style data?, options of d2l.train_concise)
    "book": (True, {"sync_every_step": True}),
    "d2l_gpu": (False, {"channels_last": True, "amp": True, "compile": True}),
}


def options(name: str, args, device) -> dict:
    """Options of one path, torch.compile only on a GPU and unless --no-compile."""
    opts = dict(PATHS[name][1])
    if "compile" in opts:
        opts["compile"] = device.type == "cuda" and not args.no_compile
    return opts


def data(name: str, args, device):
    """(train_iter, test_iter) of one path."""
    if PATHS[name][0]:
        return d2l.load_data_book_style(args.batch_size, limit=args.limit, num_workers=args.workers)
    return d2l.load_data_fashion_mnist(args.batch_size, limit=args.limit, device=device, seed=0)


def steps_rate(name: str, args, device) -> dict:
    """Images/s of --steps training steps (after one warm-up step) of one path."""
    torch.manual_seed(0)
    opts = options(name, args, device)
    net = d2l.resnet18(10, 1).to(device)
    d2l.init_every_layer(net, (1, 1, 28, 28), device)
    if opts.get("channels_last"):
        net.to(memory_format=torch.channels_last)
    model = torch.compile(net) if opts.get("compile") else net
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr)
    step = d2l.make_step(
        model,
        optimizer,
        torch.nn.CrossEntropyLoss(),
        device,
        channels_last=opts.get("channels_last", False),
        amp=opts.get("amp", False),
    )
    batches = iter(data(name, args, device)[0])
    step(*next(batches))  # warm-up: worker start-up, first kernels, compilation
    timer, n, total = d2l.Timer(device), 0, 0.0
    for _ in range(args.steps):
        X, y = next(batches)
        l = step(X, y)
        total = total + (l.item() if opts.get("sync_every_step") else l)
        n += len(y)
    timer.stop()
    return {"images_per_sec": n / timer.sum(), "sec_per_epoch": None, "test_acc": None}


def epochs_rate(name: str, args, device) -> dict:
    """Images/s, s/epoch and test accuracy of --epochs epochs of one path."""
    torch.manual_seed(0)
    train_iter, test_iter = data(name, args, device)
    r = d2l.train_concise(
        d2l.resnet18(10, 1),
        train_iter,
        test_iter,
        args.epochs,
        args.lr,
        [device],
        cosine=not args.constant_lr,
        plot=False,
        verbose=False,
        **options(name, args, device),
    )
    return {k: r[k] for k in ("images_per_sec", "sec_per_epoch", "test_acc")}


def flops() -> int:
    """FLOPs of one training image (forward and backward), counted on shapes at batch 2."""
    net = d2l.materialize(d2l.resnet18(10, 1), (1, 1, 28, 28))
    X, y = torch.zeros(2, 1, 28, 28), torch.zeros(2, dtype=torch.long)
    return d2l.training_flops(net, X, y) // 2


def run(args) -> dict:
    """Run every measurement; return the JSON-ready result."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device = d2l.try_gpu()
    d2l.read_fashion_mnist()  # parse once, outside every timing
    args_json = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    result = {"machine": machine(device), "profile": args.profile, "args": args_json}
    result["pipeline"] = pipelines(args, device)
    measure = steps_rate if args.profile == "quick" else epochs_rate
    per_image = flops()
    result["flops_per_training_image"] = per_image
    rows = []
    for name in PATHS:
        row = {"path": name, **measure(name, args, device)}
        low = bool(options(name, args, device).get("amp"))
        row["tflops"] = per_image * row["images_per_sec"] / 1e12
        peak = d2l.peak_tflops(device, low_precision=low)
        row["peak_tflops"] = peak
        row["fraction_of_peak"] = row["tflops"] / peak if peak else None
        rows.append(row)
    result["training"] = rows
    result["training_ratio"] = rows[1]["images_per_sec"] / rows[0]["images_per_sec"]
    return result


def fmt(value, spec: str) -> str:
    """A number formatted, or 'n/a' where it was not measured in this profile."""
    width = "".join(c for c in spec.split(".")[0] if c.isdigit())
    return f"{'n/a':>{width or 0}}" if value is None else format(value, spec)


def table(result: dict) -> str:
    """The result as a plain-text table."""
    m, p = result["machine"], result["pipeline"]
    lines = [
        f"device {m['device']} ({m['device_name']}), torch {m['torch']}, {m['date']}, "
        f"profile {result['profile']}",
        f"input pipeline, {p['examples']} examples: book-style {p['book']:,.0f}/s, "
        f"d2l_gpu {p['d2l_gpu']:,.0f}/s, ratio {p['ratio']:.1f}x",
        f"one training image: {result['flops_per_training_image'] / 1e9:.2f} GFLOP",
        f"{'path':<8} {'images/s':>10} {'s/epoch':>8} {'test acc':>8} {'TFLOP/s':>8} "
        f"{'of peak':>8}",
    ]
    for r in result["training"]:
        lines.append(
            f"{r['path']:<8} {r['images_per_sec']:>10,.1f} {fmt(r['sec_per_epoch'], '8.2f')} "
            f"{fmt(r['test_acc'], '8.3f')} {r['tflops']:>8.3f} "
            f"{fmt(r['fraction_of_peak'], '8.1%')}"
        )
    lines.append(f"training speed-up d2l_gpu / book: {result['training_ratio']:.1f}x")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(table(result))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
