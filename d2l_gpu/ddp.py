"""Train LeNet or ResNet-18 on Fashion-MNIST with DistributedDataParallel (lesson 7).

    torchrun --nproc-per-node 2 -m d2l_gpu.ddp --model lenet --epochs 10 --batch-size 256
    python -m d2l_gpu.ddp --model lenet --epochs 10    # one process, no launcher needed

Backend: NCCL when every local rank has a CUDA device of its own, gloo otherwise (CPU, or several
ranks sharing a GPU); the device is cuda:LOCAL_RANK. Every epoch one seeded permutation (the same
on every rank) is cut into global batches of --batch-size examples; rank r trains on the r-th
slice of each, so any world size sees the same global batches (the incomplete last one is
dropped). With --checkpoint, rank 0 atomically writes model, optimiser, epoch and every rank's
RNG state after each epoch, and a job that finds the file resumes from it.

Test and teaching aid: D2L_GPU_DDP_KILL_AT="EPOCH:STEP:RANK" (1-based epoch and step) makes that
rank SIGKILL itself just before that step, on the first attempt only (TORCHELASTIC_RESTART_COUNT
unset or 0), to show torchrun's restart and the resume from the checkpoint.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

from .checkpoint import (
    FORMAT,
    CheckpointError,
    check_checkpoint,
    get_rng_state,
    load_checkpoint,
    save_atomic,
    set_rng_state,
)
from .data import DataError, read_fashion_mnist
from .models import LeNet, init_every_layer, resnet18

__all__ = ["DDPError", "build_model", "main", "parse_args", "shard_indices", "train"]

KILL_ENV = "D2L_GPU_DDP_KILL_AT"


class DDPError(ValueError):
    """A job whose sizes do not fit together (batch, world size, number of examples)."""


def build_model(name: str, seed: int, device: torch.device) -> nn.Module:
    """A freshly initialised 'lenet' or 'resnet18' on `device`, the same on every rank."""
    torch.manual_seed(seed)
    if name == "lenet":
        return LeNet(seed).to(device)
    return init_every_layer(resnet18()).to(device)  # lazy layers get their shapes on the CPU


def parse_args(argv=None) -> argparse.Namespace:
    """Parse the command line of `python -m d2l_gpu.ddp`."""
    p = argparse.ArgumentParser(
        prog="python -m d2l_gpu.ddp",
        description="Train on Fashion-MNIST with DistributedDataParallel (run under torchrun).",
    )
    p.add_argument("--model", choices=["lenet", "resnet18"], default="lenet")
    p.add_argument("--epochs", type=int, default=10, metavar="E", help="epochs in all (10)")
    p.add_argument("--batch-size", type=int, default=256, metavar="B", help="global batch (256)")
    p.add_argument("--lr", type=float, default=0.2, metavar="LR", help="SGD learning rate (0.2)")
    p.add_argument("--limit", type=int, metavar="N", help="use the first N examples per split")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="init and shuffling seed (0)")
    p.add_argument("--checkpoint", metavar="PATH", help="resume from / save to after each epoch")
    p.add_argument("--save", metavar="PATH", help="write the final model state_dict here")
    p.add_argument("--data-dir", metavar="DIR", help="Fashion-MNIST folder (else D2L_GPU_DATA)")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto", help="(auto)")
    args = p.parse_args(argv)
    for name in ("epochs", "batch_size", "limit"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    return args


def shard_indices(
    num_examples: int, batch_size: int, epoch: int, seed: int, rank: int, world_size: int
) -> torch.Tensor:
    """Rank `rank`'s slice of every full global batch of `epoch`: (num_batches, batch/world)."""
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)  # same order on every rank
    order = torch.randperm(num_examples, generator=g)
    num_batches = num_examples // batch_size  # the last, incomplete global batch is dropped
    per_rank = batch_size // world_size
    return order[: num_batches * batch_size].view(num_batches, world_size, per_rank)[:, rank]


def _check_sizes(batch_size: int, world_size: int, num_examples: int) -> None:
    """Raise DDPError unless the global batch splits evenly and every rank gets examples."""
    if world_size > num_examples:
        raise DDPError(
            f"{world_size} ranks but only {num_examples} training examples: every rank needs "
            "at least one; use fewer processes or a larger --limit"
        )
    if batch_size % world_size:
        raise DDPError(
            f"global --batch-size {batch_size} is not divisible by the world size {world_size}: "
            f"use a multiple of {world_size}, e.g. {max(batch_size // world_size, 1) * world_size}"
        )
    if batch_size > num_examples:
        raise DDPError(f"--batch-size {batch_size} exceeds the {num_examples} training examples")


def _device_and_backend(local_rank: int, local_world: int, backend: str):
    """cuda:LOCAL_RANK with NCCL when each local rank has a GPU of its own, else gloo."""
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "nccl" or (backend == "auto" and n >= local_world):
        if n <= local_rank:
            raise DDPError(f"NCCL needs a CUDA device per rank; local rank {local_rank}, {n} GPUs")
        return torch.device("cuda", local_rank), "nccl"
    if n:  # gloo on GPUs that several ranks share
        return torch.device("cuda", local_rank % n), "gloo"
    return torch.device("cpu"), "gloo"


def _kill_at() -> tuple[int, ...] | None:
    """(epoch, step, rank) from D2L_GPU_DDP_KILL_AT, on the first attempt only; else None."""
    spec = os.environ.get(KILL_ENV)
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None
    return tuple(int(v) for v in spec.split(":"))


def _kill(epoch: int, step: int, rank: int) -> None:
    """SIGKILL this process (the test and teaching aid of D2L_GPU_DDP_KILL_AT)."""
    print(f"{KILL_ENV}: rank {rank} kills itself in epoch {epoch}, step {step}", flush=True)
    os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))


def _batch(X: torch.Tensor, y: torch.Tensor, idx: torch.Tensor):
    """Images idx of X as float32 (B,1,28,28) in [0,1], with their labels."""
    return X[idx].unsqueeze(1).to(torch.float32).div_(255), y[idx]


def _resume(args, rank: int, world: int) -> dict | None:
    """Rank 0 reads and checks the checkpoint and broadcasts it (no shared filesystem needed)."""
    payload = [None]
    if rank == 0:
        try:
            ckpt = load_checkpoint(args.checkpoint) if args.checkpoint else None
            if ckpt is not None:
                check_checkpoint(ckpt, args.checkpoint, model=args.model, world_size=world)
            payload = [("ok", ckpt)]
        except CheckpointError as e:
            payload = [("error", str(e))]
    dist.broadcast_object_list(payload, src=0)  # every rank fails together, none hangs
    status, value = payload[0]
    if status == "error":
        raise CheckpointError(value)
    return value


def _train_epoch(ddp, optimizer, X, y, epoch: int, args, rank: int, world: int) -> torch.Tensor:
    """One epoch on this rank's shards; returns [loss sum, correct, count] (not all-reduced)."""
    metric = torch.zeros(3, device=X.device)
    shards = shard_indices(len(y), args.batch_size, epoch, args.seed, rank, world)
    kill_at = _kill_at()
    for step, idx in enumerate(shards.to(X.device), 1):
        if kill_at == (epoch + 1, step, rank):
            _kill(epoch + 1, step, rank)
        Xb, yb = _batch(X, y, idx)
        y_hat = ddp(Xb)
        loss = F.cross_entropy(y_hat, yb)  # mean over this rank's shard; DDP averages gradients
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces gradient buckets while backward is still running
        optimizer.step()
        with torch.no_grad():
            metric[0] += loss * len(yb)  # kept on the device: no host sync inside the loop
            metric[1] += (y_hat.argmax(1) == yb).sum()
            metric[2] += len(yb)
    return metric


def _evaluate(net, X, y, rank: int, world: int, batch_size: int) -> torch.Tensor:
    """[correct, count] over this rank's test examples rank, rank + world, ... (not all-reduced)."""
    metric = torch.zeros(2, device=X.device)
    net.eval()
    with torch.no_grad():
        mine = torch.arange(rank, len(y), world, device=X.device)
        for idx in mine.split(batch_size):
            Xb, yb = _batch(X, y, idx)
            metric[0] += (net(Xb).argmax(1) == yb).sum()
            metric[1] += len(yb)
    net.train()
    return metric


def _log(rank: int, *args) -> None:
    if rank == 0:
        print(*args, flush=True)


def _run(args, data, rank: int, world: int, device: torch.device, backend: str) -> None:
    """Build, resume, train with DDP, evaluate, checkpoint and save; on every rank."""
    X, y, X_test, y_test = (t.to(device) for t in data)
    y, y_test = y.long(), y_test.long()  # once, not in every step
    net = build_model(args.model, args.seed, device)
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr)
    ckpt, start = _resume(args, rank, world), 0
    if ckpt is not None:
        net.load_state_dict(ckpt["model_state"])
        optimizer.load_state_dict(ckpt["optimizer_state"])
        set_rng_state(ckpt["rng"][rank], device)
        start = ckpt["epoch"]
        _log(rank, f"resumed from {args.checkpoint}: {start} of {args.epochs} epochs done")
    ddp = DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    per_rank = args.batch_size // world
    steps = len(y) // args.batch_size
    _log(
        rank,
        f"{args.model}: world size {world} ({backend}, {device.type}), {len(y)} training "
        f"examples, global batch {args.batch_size} = {world} x {per_rank}, {steps} steps/epoch",
    )
    for epoch in range(start, args.epochs):
        tic = time.perf_counter()
        metric = _train_epoch(ddp, optimizer, X, y, epoch, args, rank, world)
        metric = torch.cat([metric, _evaluate(net, X_test, y_test, rank, world, per_rank)])
        dist.all_reduce(metric)  # sums over ranks: loss, correct, count, test correct, test count
        loss_sum, correct, n, test_correct, n_test = metric.tolist()
        _log(
            rank,
            f"epoch {epoch + 1}/{args.epochs}: loss {loss_sum / n:.3f}, train acc "
            f"{correct / n:.3f}, test acc {test_correct / max(n_test, 1):.3f}, "
            f"{time.perf_counter() - tic:.1f} s",
        )
        if args.checkpoint:
            _save_checkpoint(args, net, optimizer, epoch + 1, rank, world, device)
    if args.save and rank == 0:
        save_atomic(net.state_dict(), args.save)
        _log(rank, f"saved the final model state_dict to {args.save}")
    dist.barrier()  # leave together: a rank tearing gloo down early can abort its peer at exit


def _save_checkpoint(args, net, optimizer, epoch, rank, world, device) -> None:
    """Gather every rank's RNG state; rank 0 writes atomically; all wait until it is on disk."""
    rng = [None] * world
    dist.all_gather_object(rng, get_rng_state(device))
    if rank == 0:
        ckpt = {
            "format": FORMAT,
            "model": args.model,
            "world_size": world,
            "epoch": epoch,
            "model_state": net.state_dict(),
            "optimizer_state": optimizer.state_dict(),
            "rng": rng,
            "args": {k: v for k, v in vars(args).items() if k not in ("checkpoint", "save")},
        }
        save_atomic(ckpt, args.checkpoint)
        print(f"saved checkpoint (epoch {epoch}) to {args.checkpoint}", flush=True)
    dist.barrier()  # a rank that dies after this point cannot lose this epoch


def train(args: argparse.Namespace) -> None:
    """Run the job of `args` on this rank: check sizes, join the group, train, always leave it."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    raw = read_fashion_mnist(args.data_dir)
    n = args.limit
    data = tuple(
        raw[f"{split}_{kind}"][:n] for split in ("train", "test") for kind in ("images", "labels")
    )
    _check_sizes(args.batch_size, world, len(data[1]))  # before joining: every rank fails alike
    device, backend = _device_and_backend(local_rank, local_world, args.backend)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # deterministic convolutions: a resumed job must repeat the uninterrupted one exactly
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    if "MASTER_ADDR" in os.environ:  # launched by torchrun (or by hand with the env:// variables)
        store, rank, world = next(dist.rendezvous("env://"))
        # torchrun's store outlives a restart: give each attempt fresh keys, or the new ranks may
        # read the dead ranks' gloo addresses ("Connection refused")
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"d2l_gpu.ddp/attempt{attempt}", store)
        nccl_device = device if backend == "nccl" else None
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world, device_id=nccl_device
        )
    else:  # a lone process: a group of one, no network
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        _run(args, data, rank, world, device, backend)
    finally:
        dist.destroy_process_group()


def main(argv=None) -> int:
    """Command-line entry point; returns the exit status."""
    args = parse_args(argv)
    try:
        train(args)
    except (DDPError, CheckpointError, DataError) as e:
        rank = os.environ.get("RANK", "0")
        print(f"d2l_gpu.ddp: error (rank {rank}): {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
