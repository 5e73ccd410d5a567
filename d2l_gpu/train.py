"""Train LeNet or ResNet-18 on Fashion-MNIST on one process or many (lesson 7).

    torchrun --nproc-per-node 2 -m d2l_gpu.train --model lenet --epochs 10 --batch-size 256
    python -m d2l_gpu.train --model lenet --epochs 10    # one process, no launcher needed

Backend: NCCL when every local rank has a CUDA device of its own, gloo otherwise (CPU, or several
ranks sharing a GPU); the device is cuda:LOCAL_RANK. Every epoch one seeded permutation (the same
on every rank) is cut into global batches of --batch-size examples; with a data-parallel
strategy rank r trains on the r-th slice of each, so any world size sees the same global batches
(the incomplete last one is dropped). With --checkpoint, rank 0 atomically writes the model,
optimiser, epoch, settings and every rank's RNG state after each epoch, and a job that finds the
file resumes from it, after checking that it belongs to the same job.
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
from tqdm import tqdm

from .checkpoint import (
    FORMAT,
    CheckpointError,
    check_checkpoint,
    check_optimizer_state,
    check_output,
    check_rng_states,
    check_state_fits,
    get_rng_state,
    load_checkpoint,
    save_atomic,
    set_rng_state,
)
from .data import DataError, fashion_mnist_dir, read_fashion_mnist
from .distributed import device_and_backend, join_group, leave_group
from .strategies import STRATEGIES, build_model, make_strategy

__all__ = ["TrainConfig", "TrainError", "main", "parse_args", "shard_indices", "train"]

MODELS = ("lenet", "resnet18")
DTYPES = {"float32": torch.float32, "float64": torch.float64}


class _Bar(tqdm):
    """tqdm without its monitor thread: no thread of ours outlives the job."""

    monitor_interval = 0


class TrainError(ValueError):
    """A job that cannot run as asked (sizes that do not fit, a loss that is no longer finite)."""


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
    dtype: str = "float32"
    progress: bool | None = None  # None: a progress bar only when stderr is a terminal

    # settings that define the job: a resumed job must have the checkpoint's
    MUST_MATCH = ("model", "batch_size", "lr", "limit", "seed", "data_dir", "dtype")
    # settings that may change on resume (said when they do): more epochs, another strategy
    MAY_CHANGE = ("epochs", "strategy")

    def __post_init__(self):
        for name in ("epochs", "batch_size", "limit"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"--{_flag(name)} must be a positive integer, got {value}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"--lr must be a positive finite number, got {self.lr}")
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
    """argparse type for --lr: a finite number above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


def parse_args(argv=None, prog: str = "python -m d2l_gpu.train") -> TrainConfig:
    """Parse the command line into a TrainConfig (exit 2 naming the flag on bad input)."""
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
    p.add_argument("--strategy", choices=list(STRATEGIES), default="ddp", help="(ddp)")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32", help="(float32)")
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


def shard_indices(
    num_examples: int, batch_size: int, epoch: int, seed: int, rank: int, world_size: int
) -> torch.Tensor:
    """Rank `rank`'s slice of every full global batch of `epoch`: (num_batches, batch/world).

    Shown in lesson 7."""
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)  # same order on every rank
    order = torch.randperm(num_examples, generator=g)
    num_batches = num_examples // batch_size  # the last, incomplete global batch is dropped
    per_rank = batch_size // world_size
    return order[: num_batches * batch_size].view(num_batches, world_size, per_rank)[:, rank]


def _check_sizes(batch_size: int, world_size: int, num_examples: int) -> None:
    """Raise TrainError unless the global batch splits evenly and every rank gets examples."""
    if world_size > num_examples:
        raise TrainError(
            f"{world_size} ranks but only {num_examples} training examples: every rank needs "
            "at least one; use fewer processes or a larger --limit"
        )
    if batch_size % world_size:
        raise TrainError(
            f"global --batch-size {batch_size} is not divisible by the world size {world_size}: "
            f"use a multiple of {world_size}, e.g. {max(batch_size // world_size, 1) * world_size}"
        )
    if batch_size > num_examples:
        raise TrainError(f"--batch-size {batch_size} exceeds the {num_examples} training examples")


def _batch(X: torch.Tensor, y: torch.Tensor, idx: torch.Tensor, dtype: torch.dtype):
    """Images idx of X as (B,1,28,28) floats in [0,1], with their labels."""
    return X[idx].unsqueeze(1).to(dtype).div_(255), y[idx]


def _log(rank: int, *args) -> None:
    if rank == 0:
        print(*args, flush=True)


def _resume(cfg: TrainConfig, net, rank: int, world: int) -> dict | None:
    """Rank 0 checks the outputs, reads and checks the checkpoint, and broadcasts the outcome."""
    payload = [None]
    if rank == 0:
        try:
            for path, flag in ((cfg.checkpoint, "--checkpoint"), (cfg.save, "--save")):
                if path:
                    check_output(path, flag)
            ckpt = load_checkpoint(cfg.checkpoint) if cfg.checkpoint else None
            if ckpt is not None:
                settings = cfg.settings()
                notes = check_checkpoint(
                    ckpt, cfg.checkpoint, settings, world_size=world, may_change=cfg.MAY_CHANGE
                )
                check_state_fits(ckpt.get("model_state"), net.state_dict(), cfg.checkpoint)
                names = [name for name, _ in net.named_parameters()]
                check_optimizer_state(ckpt.get("optimizer_state"), names, cfg.checkpoint)
                check_rng_states(ckpt.get("rng"), world, cfg.checkpoint)
                ckpt["notes"] = notes
            payload = [("ok", ckpt)]
        except CheckpointError as e:
            payload = [("error", str(e))]
    dist.broadcast_object_list(payload, src=0)  # every rank fails together, none hangs
    status, value = payload[0]
    if status == "error":
        raise CheckpointError(value)
    return value


def _train_epoch(strategy, X, y, epoch: int, cfg: TrainConfig, rank: int, world: int):
    """One epoch of SGD steps; returns [loss sum, correct, count] on this rank (not reduced)."""
    metric = torch.zeros(3, dtype=torch.float64, device=X.device)
    shard_rank, shard_world = (rank, world) if strategy.splits_data else (0, 1)
    shards = shard_indices(len(y), cfg.batch_size, epoch, cfg.seed, shard_rank, shard_world)
    quiet = rank != 0 or (None if cfg.progress is None else not cfg.progress)
    bar = _Bar(total=len(shards), desc=f"epoch {epoch + 1}", unit="step", leave=False,
               disable=quiet, file=sys.stderr)  # fmt: skip
    with bar:
        for idx in shards.to(X.device):
            Xb, yb = _batch(X, y, idx, DTYPES[cfg.dtype])
            loss_sum, correct = strategy.train_step(Xb, yb)
            with torch.no_grad():
                metric[0] += loss_sum  # kept on the device: no host sync inside the loop
                metric[1] += correct
                metric[2] += len(yb)
            bar.update()
    return metric


def _evaluate(strategy, X, y, cfg: TrainConfig, rank: int, world: int) -> torch.Tensor:
    """[correct, count] of this rank's part of the test set (not reduced); every rank calls it."""
    metric = torch.zeros(2, dtype=torch.float64, device=X.device)
    with torch.no_grad():
        strategy.net.eval()
        for chunk in torch.arange(len(y), device=X.device).split(cfg.batch_size):
            mine = chunk[rank::world] if strategy.splits_data else chunk
            Xb, yb = _batch(X, y, mine, DTYPES[cfg.dtype])
            y_hat = strategy.predict(Xb)  # collective for some strategies: every rank calls it
            if y_hat is not None:
                metric[0] += (y_hat.argmax(1) == yb).sum()
                metric[1] += len(yb)
        strategy.net.train()
    return metric


def _save_checkpoint(cfg: TrainConfig, strategy, epoch: int, rank: int, world: int, device):
    """Gather states and every rank's RNG state; rank 0 writes atomically; all wait for it."""
    rng = [None] * world
    dist.all_gather_object(rng, get_rng_state(device))
    model_state, optimizer_state = strategy.model_state(), strategy.optimizer_state()
    if rank == 0:
        ckpt = {"format": FORMAT, "settings": cfg.settings(), "world_size": world,
                "epoch": epoch, "model_state": model_state, "optimizer_state": optimizer_state,
                "rng": rng}  # fmt: skip
        save_atomic(ckpt, cfg.checkpoint)
        print(f"saved checkpoint (epoch {epoch}) to {cfg.checkpoint}", flush=True)
    dist.barrier()  # a rank that dies after this point cannot lose this epoch


def _run(cfg: TrainConfig, data, rank: int, world: int, device, backend: str) -> None:
    """Build, resume, train, evaluate, checkpoint and save; on every rank."""
    X, y, X_test, y_test = (t.to(device) for t in data)
    y, y_test = y.long(), y_test.long()  # once, not in every step
    net = build_model(cfg.model, cfg.seed, device, DTYPES[cfg.dtype])
    ckpt, start = _resume(cfg, net, rank, world), 0
    if ckpt is not None:
        net.load_state_dict(ckpt["model_state"])
        set_rng_state(ckpt["rng"][rank], device)
        start = ckpt["epoch"]
        _log(rank, f"resumed from {cfg.checkpoint}: {start} of {cfg.epochs} epochs done")
        for note in ckpt["notes"]:
            _log(rank, f"continuing with {note}")
    strategy = make_strategy(cfg.strategy, net, cfg.lr, rank, world, device)
    if ckpt is not None:
        strategy.load_optimizer_state(ckpt["optimizer_state"])
    del ckpt
    per_rank = cfg.batch_size // world if strategy.splits_data else cfg.batch_size
    _log(
        rank,
        f"{cfg.model}: world size {world} ({backend}, {device.type}, {cfg.strategy}), "
        f"{len(y)} training examples, global batch {cfg.batch_size} = {world} x {per_rank}, "
        f"{len(y) // cfg.batch_size} steps/epoch",
    )
    for epoch in range(start, cfg.epochs):
        tic = time.perf_counter()
        metric = _train_epoch(strategy, X, y, epoch, cfg, rank, world)
        metric = torch.cat([metric, _evaluate(strategy, X_test, y_test, cfg, rank, world)])
        dist.all_reduce(metric)  # sums over ranks: loss, correct, count, test correct, test count
        loss_sum, correct, n, test_correct, n_test = metric.tolist()
        if not math.isfinite(loss_sum):
            kept = f"; {cfg.checkpoint} keeps epoch {epoch}" if cfg.checkpoint and epoch else ""
            raise TrainError(
                f"the training loss became {loss_sum / n} in epoch {epoch + 1}: training "
                f"diverged, try a smaller --lr than {cfg.lr}. Nothing of this epoch was "
                f"saved{kept}"
            )
        _log(
            rank,
            f"epoch {epoch + 1}/{cfg.epochs}: loss {loss_sum / n:.3f}, train acc "
            f"{correct / n:.3f}, test acc {test_correct / max(n_test, 1):.3f}, "
            f"{time.perf_counter() - tic:.1f} s",
        )
        if cfg.checkpoint:
            _save_checkpoint(cfg, strategy, epoch + 1, rank, world, device)
    if cfg.save:
        state = strategy.model_state()
        if rank == 0:
            save_atomic(state, cfg.save)
            _log(rank, f"saved the final model state_dict to {cfg.save}")
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
    shard_world = world if STRATEGIES[cfg.strategy].splits_data else 1
    _check_sizes(cfg.batch_size, shard_world, len(data[1]))  # before joining: all fail alike
    device, backend = device_and_backend(local_rank, local_world, cfg.backend)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # deterministic convolutions: a resumed job must repeat the uninterrupted one exactly
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    rank, world = join_group(backend, device)
    try:
        _run(cfg, data, rank, world, device, backend)
    finally:
        leave_group()


def main(argv=None, prog: str = "python -m d2l_gpu.train") -> int:
    """Command-line entry point; returns the exit status (2: a job that cannot run as asked)."""
    cfg = parse_args(argv, prog)
    try:
        train(cfg)
    except (TrainError, CheckpointError, DataError) as e:
        rank = os.environ.get("RANK", "0")
        print(f"{prog.split()[-1]}: error (rank {rank}): {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
