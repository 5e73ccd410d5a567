"""One epoch of the training script (lesson 7): the global batches of a seeded permutation, each
rank's shard of them, the training steps and the evaluation, over any strategy.

An example is an image and its class, or (--model transformer) a window of characters and the
next character at each place; `mean_loss` and `correct` score both alike, so that the training
step of every strategy is written once (strategies/base.py)."""

from __future__ import annotations

import sys

import torch
from tqdm import tqdm

from .config import TrainError
from .strategies import Strategy
from .strategies.base import correct

__all__ = ["check_sizes", "evaluate", "shard_indices", "train_epoch"]


def shard_indices(
    num_examples: int, batch_size: int, epoch: int, seed: int, rank: int, world_size: int
) -> torch.Tensor:
    """Rank `rank`'s slice of every full global batch of `epoch`: (num_batches, batch/world)."""
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)  # same order on every rank
    order = torch.randperm(num_examples, generator=g)
    num_batches = num_examples // batch_size  # the last, incomplete global batch is dropped
    per_rank = batch_size // world_size
    return order[: num_batches * batch_size].view(num_batches, world_size, per_rank)[:, rank]


def check_sizes(batch_size: int, world_size: int, num_examples: int, accumulate: int = 1) -> None:
    """Raise TrainError unless the global batch splits evenly, every rank gets examples and each
    rank's part holds at least `accumulate` of them (one per micro-batch)."""
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
    if batch_size // world_size < accumulate:
        raise TrainError(
            f"--accumulate {accumulate} cuts each rank's {batch_size // world_size} examples of a "
            f"global batch into more micro-batches than examples: use at most "
            f"{batch_size // world_size}, or a larger --batch-size"
        )


class _Bar(tqdm):
    """tqdm without its monitor thread: no thread of ours outlives the job."""

    monitor_interval = 0


def _batch(X: torch.Tensor, y: torch.Tensor, idx: torch.Tensor, dtype: torch.dtype):
    """Examples idx: images (B,1,28,28) as floats in [0,1] with their labels, or windows of
    token ids (X of two dimensions) with their next tokens, as they are."""
    if X.dim() == 2:
        return X[idx], y[idx]
    return X[idx].unsqueeze(1).to(dtype).div_(255), y[idx]


def train_epoch(strategy: Strategy, X, y, epoch: int) -> torch.Tensor:
    """One epoch of SGD steps of the strategy's job; [loss sum, correct, count] on this rank (not
    yet summed over ranks)."""
    cfg, rank = strategy.cfg, strategy.rank
    metric = torch.zeros(3, dtype=torch.float64, device=X.device)
    shards = shard_indices(
        len(y), cfg.batch_size, epoch, cfg.seed, strategy.data_rank, strategy.data_world
    )
    quiet = rank != 0 or (None if cfg.progress is None else not cfg.progress)
    bar = _Bar(total=len(shards), desc=f"epoch {epoch + 1}", unit="step", leave=False,
               disable=quiet, file=sys.stderr)  # fmt: skip
    with bar:
        for idx in shards.to(X.device):
            Xb, yb = _batch(X, y, idx, strategy.dtype)
            loss_sum, correct, count = strategy.train_step(Xb, yb)
            with torch.no_grad():
                metric[0] += loss_sum  # kept on the device: no host sync inside the loop
                metric[1] += correct
                metric[2] += count
            bar.update()
    return metric if strategy.reports else metric.zero_()


def evaluate(strategy: Strategy, X, y) -> torch.Tensor:
    """[correct, count] of this rank's part of the test set (not yet summed over ranks); every
    rank calls it."""
    metric = torch.zeros(2, dtype=torch.float64, device=X.device)
    with torch.no_grad():
        strategy.net.eval()
        for chunk in torch.arange(len(y), device=X.device).split(strategy.cfg.batch_size):
            Xb, yb = _batch(X, y, chunk[strategy.data_rank :: strategy.data_world], strategy.dtype)
            y_hat = strategy.predict(Xb)  # collective for some strategies: every rank calls it
            if y_hat is not None:
                metric[0] += correct(y_hat, yb)
                metric[1] += len(yb)
        strategy.net.train()
    return metric if strategy.reports else metric.zero_()
