"""Train LeNet or ResNet-18 on Fashion-MNIST on one process or many (lesson 7).

    python -m d2l_gpu.train --model lenet --epochs 10    # one process, no launcher needed
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nproc-per-node 2 --rdzv-backend c10d \
        --rdzv-conf store_type=file --local-addr 127.0.0.1 -m d2l_gpu.train --strategy fsdp

(The second form keeps a one-machine job off the network; `distributed.local_torchrun` builds
it.) Backend: NCCL when every local rank has a CUDA device of its own, gloo otherwise; the
device is cuda:LOCAL_RANK. Every epoch one seeded permutation (the same on every rank) is cut
into global batches of --batch-size examples; a data-parallel strategy gives rank r the r-th
slice of each, so any world size sees the same global batches (the last, incomplete one is
dropped). With --checkpoint, rank 0 atomically writes the full model and optimizer states,
epoch, settings and every rank's RNG state after each epoch; a job that finds the file resumes
from it after checking that it belongs to the same job. Exit status: 0 done; 1 lost contact
with the other ranks; 2 a job that cannot run as asked, said in one sentence.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch
import torch.distributed as dist

from .checkpoint import CheckpointError, resume, save_atomic, save_checkpoint, set_rng_state
from .data import DataError, fashion_mnist_dir, read_fashion_mnist
from .distributed import device_and_backend, join_group, leave_group, lost_contact
from .stopping import (
    DONE,
    FINAL,
    LOST,
    STOPPED,
    Stopped,
    end_with_agent,
    kept,
    say_line,
    stop_on_signals,
    stop_restarts,
)
from .strategies import (
    DTYPES,
    STRATEGIES,
    TrainError,
    build_model,
    check_sizes,
    evaluate,
    make_strategy,
    shard_indices,
    strategy_class,
    train_epoch,
)

__all__ = ["TrainConfig", "TrainError", "main", "parse_args", "shard_indices", "train"]

MODELS = ("lenet", "resnet18")


@dataclass(frozen=True)
class TrainConfig:
    """The settings of one training job: what the flags fill and what a checkpoint records."""

    model: str = "lenet"
    epochs: int = 10
    batch_size: int = 256
    lr: float = 0.2
    limit: int | None = None
    seed: int = 0
    checkpoint: str | None = None
    save: str | None = None
    data_dir: str | None = None
    backend: str = "auto"
    strategy: str = "ddp"
    microbatches: int = 4  # micro-batches per global batch (--strategy pipeline)
    dtype: str = "float32"
    timeout: float = 600.0  # seconds a rank waits for the others before it gives up
    progress: bool | None = None  # None: a progress bar only when stderr is a terminal

    # settings that define the job: a resumed job must have the checkpoint's
    MUST_MATCH = ("model", "batch_size", "lr", "limit", "seed", "data_dir", "dtype")
    # settings that may change on resume (said when they do): more epochs, another strategy
    MAY_CHANGE = ("epochs", "strategy", "microbatches")

    def __post_init__(self):
        for name in ("epochs", "batch_size", "limit", "microbatches"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"--{_flag(name)} must be a positive integer, got {value}")
        for name in ("lr", "timeout"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"--{name} must be a positive finite number, got {value}")
        for name, allowed in (("model", MODELS), ("dtype", DTYPES), ("strategy", STRATEGIES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"--{name} must be one of {', '.join(allowed)}")
        if self.checkpoint and self.save and _same_file(self.checkpoint, self.save):
            raise ValueError(
                f"--checkpoint and --save name the same file {self.save!r}: the final model "
                "would replace the checkpoint; give --save another path"
            )

    def settings(self) -> dict:
        """What a checkpoint records and a resume compares (no output paths, no display)."""
        return {k: getattr(self, k) for k in self.MUST_MATCH + self.MAY_CHANGE}


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _same_file(a: str, b: str) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def _positive_float(text: str) -> float:
    """argparse type for --lr and --timeout: a finite number above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


def parse_args(argv=None, prog: str = "python -m d2l_gpu.train") -> TrainConfig:
    """Parse the command line into a TrainConfig (exit 2 naming the flag on bad input).

    Shown in lesson 7."""
    p = argparse.ArgumentParser(
        prog=prog, description="Train on Fashion-MNIST on one process or many (under torchrun)."
    )
    p.add_argument("--model", choices=MODELS, default="lenet")
    p.add_argument("--epochs", type=int, default=10, metavar="E", help="epochs in all (10)")
    p.add_argument("--batch-size", type=int, default=256, metavar="B", help="global batch (256)")
    p.add_argument("--lr", type=_positive_float, default=0.2, help="SGD learning rate (0.2)")
    p.add_argument("--limit", type=int, metavar="N", help="use the first N examples per split")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="init and shuffling seed (0)")
    p.add_argument("--checkpoint", metavar="PATH", help="resume from / save to after each epoch")
    p.add_argument("--save", metavar="PATH", help="write the final model state_dict here")
    p.add_argument("--data-dir", metavar="DIR", help="Fashion-MNIST folder (else D2L_GPU_DATA)")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto", help="(auto)")
    p.add_argument(
        "--strategy",
        choices=list(STRATEGIES),
        default="ddp",
        help="ddp: whole model per rank; fsdp: sharded; pipeline: layers cut (ddp)",
    )
    p.add_argument("--microbatches", type=int, default=4, metavar="M",
                   help="micro-batches per global batch for --strategy pipeline (4)")  # fmt: skip
    p.add_argument("--dtype", choices=list(DTYPES), default="float32", help="(float32)")
    p.add_argument("--timeout", type=_positive_float, default=600.0, metavar="S",
                   help="seconds a rank waits for the others before it gives up (600)")  # fmt: skip
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        help="progress bar per epoch (default: only when stderr is a terminal)",
    )
    args = p.parse_args(argv)
    try:
        return TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    except ValueError as e:
        p.error(str(e))


def _log(rank: int, *args) -> None:
    if rank == 0:
        print(*args, flush=True)


def _epoch(cfg: TrainConfig, strategy, data, epoch: int, rank: int, world: int) -> None:
    """Train and evaluate one epoch, sum the figures over ranks, stop if the loss diverged."""
    X, y, X_test, y_test = data
    tic = time.perf_counter()
    metric = train_epoch(strategy, X, y, epoch, cfg, rank, world)
    metric = torch.cat([metric, evaluate(strategy, X_test, y_test, cfg, rank, world)])
    dist.all_reduce(metric)  # sums over ranks: loss, correct, count, test correct, test count
    loss_sum, correct, n, test_correct, n_test = metric.tolist()
    if not math.isfinite(loss_sum):
        kept = f"; {cfg.checkpoint} keeps epoch {epoch}" if cfg.checkpoint and epoch else ""
        raise TrainError(
            f"the training loss became {loss_sum / n} in epoch {epoch + 1}: training diverged, "
            f"try a smaller --lr than {cfg.lr}. Nothing of this epoch was saved{kept}"
        )
    _log(
        rank,
        f"epoch {epoch + 1}/{cfg.epochs}: loss {loss_sum / n:.3f}, train acc {correct / n:.3f}, "
        f"test acc {test_correct / max(n_test, 1):.3f}, {time.perf_counter() - tic:.1f} s",
    )


def _run(cfg: TrainConfig, data, rank: int, world: int, device, backend: str) -> None:
    """Build, resume, train, evaluate, checkpoint and save; on every rank."""
    X, y, X_test, y_test = (t.to(device) for t in data)
    y, y_test = y.long(), y_test.long()  # once, not in every step
    net = build_model(cfg.model, cfg.seed, device, DTYPES[cfg.dtype])
    ckpt, start = resume(cfg, net, rank, world), 0
    if ckpt is not None:
        net.load_state_dict(ckpt["model_state"])
        set_rng_state(ckpt["rng"][rank], device)
        start = ckpt["epoch"]
        _log(rank, f"resumed from {cfg.checkpoint}: {start} of {cfg.epochs} epochs done")
        for note in ckpt["notes"]:
            _log(rank, f"continuing with {note}")
    strategy = make_strategy(cfg.strategy, net, cfg, rank, world, device)
    if ckpt is not None:
        strategy.load_optimizer_state(ckpt["optimizer_state"])
    del ckpt
    if strategy.splits_data:
        split = f"{world} x {cfg.batch_size // world}"
    else:
        split = f"{cfg.microbatches} micro-batches of {cfg.batch_size // cfg.microbatches}"
    _log(
        rank,
        f"{cfg.model}: world size {world} ({backend}, {device.type}, {cfg.strategy}), "
        f"{len(y)} training examples, global batch {cfg.batch_size} = {split}, "
        f"{len(y) // cfg.batch_size} steps/epoch",
    )
    try:
        for epoch in range(start, cfg.epochs):
            _epoch(cfg, strategy, (X, y, X_test, y_test), epoch, rank, world)
            if cfg.checkpoint:
                save_checkpoint(cfg, strategy, epoch + 1, rank, world, device)
        if cfg.save:
            state = strategy.model_state()  # every rank: some strategies gather it
            if rank == 0:
                save_atomic(state, cfg.save)
                _log(rank, f"saved the final model state_dict to {cfg.save}")
    finally:
        strategy.close()
    dist.barrier()  # nobody leaves while another rank may still need it


def train(cfg: TrainConfig) -> None:
    """Run the job `cfg` on this rank: check it, join the group, train, always leave the group.

    Shown in lesson 7."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    folder = fashion_mnist_dir(cfg.data_dir)
    cfg = replace(cfg, data_dir=str(folder.resolve()))  # the checkpoint records where
    raw = read_fashion_mnist(folder)
    n = cfg.limit
    data = tuple(
        raw[f"{split}_{kind}"][:n] for split in ("train", "test") for kind in ("images", "labels")
    )
    kind = strategy_class(cfg.strategy)
    kind.check(cfg, world)  # before joining the group: every rank fails alike, none waits
    check_sizes(cfg.batch_size, world if kind.splits_data else 1, len(data[1]))
    try:
        device, backend = device_and_backend(local_rank, local_world, cfg.backend)
    except ValueError as e:  # --backend nccl without a GPU per rank
        raise TrainError(str(e)) from e
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # deterministic convolutions: a resumed job must repeat the uninterrupted one exactly
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    rank, world = join_group(backend, device, cfg.timeout)
    try:
        _run(cfg, data, rank, world, device, backend)
    finally:
        leave_group()


def main(argv=None, prog: str = "python -m d2l_gpu.train") -> int:
    """Command-line entry point; returns the exit status (see d2l_gpu.stopping). Shown in lesson 7.

    0: done; 1: lost contact with the other ranks (torchrun may restart); 2: a job that cannot
    run as asked (bad flags, data or checkpoint, a full disk), said in a sentence: final, no
    restart; 130: stopped by Ctrl-C or SIGTERM."""
    cfg = parse_args(argv, prog)
    rank, name = os.environ.get("RANK", "0"), prog.split()[-1]
    end_with_agent(name, rank)
    try:
        train(cfg)
    except Stopped as e:
        if rank == "0":
            say_line(f"{name}: stopped by {e}; {kept(cfg.checkpoint)}")
        return STOPPED
    except (TrainError, CheckpointError, DataError) as e:
        say_line(f"{name}: error (rank {rank}): {e}")
        stop_restarts()
        return FINAL
    except RuntimeError as e:
        if not lost_contact(e):
            raise
        first = str(e).strip().splitlines()[0][:300]
        say_line(
            f"{name}: error (rank {rank}): lost contact with the other ranks ({first}); a rank "
            f"died or the network failed (--timeout {cfg.timeout:g} s). Under torchrun "
            "--max-restarts the job restarts and resumes from its --checkpoint"
        )
        return LOST
    return DONE


if __name__ == "__main__":
    stop_on_signals()
    sys.exit(main())
