"""Train LeNet or ResNet-18 on Fashion-MNIST, or a small character transformer on Python's own
help text, on one process or many (lesson 7).

    python -m d2l_gpu.train --model lenet --epochs 10    # one process, no launcher needed
    python -m d2l_gpu.torchrun --nproc-per-node 2 -m d2l_gpu.train --strategy fsdp

(The second form is torchrun kept off the network and leaving no file behind: d2l_gpu.torchrun,
built on `distributed.local_torchrun`.) Backend: NCCL when every local rank has a CUDA device of
its own, gloo otherwise; the device is cuda:LOCAL_RANK. Every epoch one seeded permutation (the
same on every rank) is cut into global batches of --batch-size examples; a data-parallel strategy
gives rank r the r-th slice of each, so any world size sees the same global batches (the last,
incomplete one is dropped). With --checkpoint, rank 0 atomically writes the full model and
optimizer states, epoch, settings and every rank's RNG state after each epoch; a job that finds the
file resumes from it after checking that it belongs to the same job. Exit status: 0 done; 1 lost
contact with the other ranks; 2 a job that cannot run as asked, said in one sentence.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import replace

import torch
import torch.distributed as dist

from ..data.fashion_mnist import DataError, fashion_mnist_dir, read_fashion_mnist
from ..data.text import char_windows, encode, python_help_text
from ..distributed import device_and_backend, end_at_once, join_group, leave_group, lost_contact
from ..stopping import (
    DONE,
    FINAL,
    LOST,
    STOPPED,
    Stopped,
    end_with_agent,
    kept,
    say_line,
    stop_restarts,
)
from .checkpoint import CheckpointError, resume, save_atomic, save_checkpoint, set_rng_state
from .config import DTYPES, SEQ_LEN, TEXT_MODELS, Placement, TrainConfig, TrainError, parse_args
from .epochs import check_sizes, evaluate, shard_indices, train_epoch
from .strategies import make_strategy, strategy_class
from .strategies.base import build_model

__all__ = [
    "TrainConfig",
    "TrainError",
    "check_sizes",
    "main",
    "parse_args",
    "shard_indices",
    "train",
]


def _log(rank: int, *args) -> None:
    if rank == 0:
        print(*args, flush=True)


def _epoch(strategy, data, epoch: int) -> None:
    """Train and evaluate one epoch, sum the figures over ranks, stop if the loss diverged."""
    X, y, X_test, y_test = data
    cfg, rank = strategy.cfg, strategy.rank
    tic = time.perf_counter()
    metric = train_epoch(strategy, X, y, epoch)
    metric = torch.cat([metric, evaluate(strategy, X_test, y_test)])
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


def _run(cfg: TrainConfig, data, where: Placement, backend: str) -> None:
    """Build, resume, train, evaluate, checkpoint and save; on every rank."""
    rank, world, device = where.rank, where.world, where.device
    X, y, X_test, y_test = (t.to(device) for t in data)
    y, y_test = y.long(), y_test.long()  # once, not in every step
    net = build_model(cfg.model, cfg.seed, device, DTYPES[cfg.dtype])
    ckpt, start = resume(cfg, net, where), 0
    if ckpt is not None:
        net.load_state_dict(ckpt["model_state"])
        # A rank the checkpoint's job did not have takes rank 0's state: the script draws no
        # random number after building the model (each epoch's order comes from seed and epoch)
        set_rng_state(ckpt["rng"][rank if rank < len(ckpt["rng"]) else 0], device)
        start = ckpt["epoch"]
        _log(rank, f"resumed from {cfg.checkpoint}: {start} of {cfg.epochs} epochs done")
        for note in ckpt["notes"]:
            _log(rank, f"continuing with {note}")
    strategy = make_strategy(net, cfg, where)
    if ckpt is not None:
        strategy.load_optimizer_state(ckpt["optimizer_state"])
    del ckpt
    if cfg.strategy == "pipeline":
        split = f"{cfg.microbatches} micro-batches of {cfg.batch_size // cfg.microbatches}"
    else:
        parts = strategy.data_world
        split = f"{parts} x {cfg.batch_size // parts}"
    _log(
        rank,
        f"{cfg.model}: world size {world} ({backend}, {device.type}, {cfg.strategy}), "
        f"{len(y)} training examples, global batch {cfg.batch_size} = {split}, "
        f"{len(y) // cfg.batch_size} steps/epoch",
    )
    try:
        for epoch in range(start, cfg.epochs):
            _epoch(strategy, (X, y, X_test, y_test), epoch)
            if cfg.checkpoint:
                save_checkpoint(strategy, epoch + 1)
        if cfg.save:
            state = strategy.model_state()  # every rank: some strategies gather it
            if rank == 0:
                save_atomic(state, cfg.save)
                _log(rank, f"saved the final model state_dict to {cfg.save}")
    finally:
        strategy.close()
    dist.barrier()  # nobody leaves while another rank may still need it


def read_data(cfg: TrainConfig) -> tuple[TrainConfig, tuple]:
    """The job's (X, y, X_test, y_test), each cut to --limit examples, and its settings with the
    data folder it read (which a checkpoint records): Fashion-MNIST's images and labels, or for
    --model transformer windows of SEQ_LEN characters of Python's help text and the next ones."""
    n = cfg.limit
    if cfg.model in TEXT_MODELS:
        return cfg, tuple(t[:n] for t in char_windows(encode(python_help_text()), SEQ_LEN))
    folder = fashion_mnist_dir(cfg.data_dir)
    raw = read_fashion_mnist(folder)
    data = tuple(
        raw[f"{split}_{kind}"][:n] for split in ("train", "test") for kind in ("images", "labels")
    )
    return replace(cfg, data_dir=str(folder.resolve())), data


def train(cfg: TrainConfig) -> None:
    """Run the job `cfg` on this rank: check it, join the group, train, always leave the group."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    cfg, data = read_data(cfg)
    kind = strategy_class(cfg.strategy)
    kind.check(cfg, world)  # before joining the group: every rank fails alike, none waits
    check_sizes(cfg.batch_size, kind.data_parallel_size(cfg, world), len(data[1]), cfg.accumulate)
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
        _run(cfg, data, Placement(rank, world, device), backend)
    finally:
        leave_group()


def main(argv=None, prog: str = "python -m d2l_gpu.train") -> int:
    """Command-line entry point; returns the exit status (see d2l_gpu.stopping).

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
        # The rank ends here, before this exception and the frames it holds are freed: they hold
        # DDP's reducer, which would free the group while holding the GIL, and a gloo thread
        # still freeing the failed collective waits for the GIL: both wait forever (seen with
        # PyTorch 2.13 on lesson 7's machine switched off: the orphaned rank kept the job's
        # output open). A group that lost a rank cannot be used again anyway.
        end_at_once(LOST)
        return LOST  # not reached: for readers and type checkers
    return DONE
