"""PyTorch's fully sharded data parallelism, `fully_shard` (FSDP2, ZeRO stage 3), measured the
same way as lesson 11's ZeRO from scratch, optionally with activation checkpointing, and hybrid
sharding (HSDP): shards within groups of ranks, the groups replicas of each other.

Shown in lesson 11. Every rank trains the same seeded MLP with Adam on its part of each batch.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from .._typed import wrap_public
from ..distributed import full_tensor, rank_device, require_torch
from ..models import mlp
from . import worker_args
from .footprint import CollectiveCounter, measured_bytes, train_measured, warm_up_once
from .memory import checkpoint_every
from .workload import Workload


def _data_parallel_run(net, rank: int, world: int, work: Workload, device, base) -> dict:
    """Adam steps on this rank's part of each batch; measured, and one step's collectives."""
    worker_args.even_batch(work.batch_size, world)
    X, y = work.data()
    X, y = X.tensor_split(world)[rank].to(device), y.tensor_split(world)[rank].to(device)
    opt = torch.optim.Adam(net.parameters(), lr=work.lr)
    counter, count = CollectiveCounter(), [0]

    def step():
        count[0] += 1
        with counter if count[0] == 1 else contextlib.nullcontext():  # what one step sends
            loss = F.cross_entropy(net(X), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        return loss.item()

    run = train_measured(step, work.steps, device, [net, opt], base, measure=measured_bytes)
    return {**run, "losses": run.pop("outputs"), "calls": counter.calls, "bytes": counter.bytes}


def _sharded_mlp(work: Workload, checkpointing: bool, device, replicas: int = 1) -> nn.Module:
    """work's seeded MLP with fully_shard on every linear layer and the root; with `replicas` > 1,
    on a 2-D mesh (replicate, shard): HSDP."""
    require_torch(2, 6, "fully_shard (FSDP2) on a CPU")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    net = mlp(list(work.widths), work.seed, work.dtype).to(device)
    if checkpointing:
        net = checkpoint_every(net, every=2)  # each (Linear, ReLU) pair recomputed in backward
    # The mesh on this rank's device: without one, fully_shard takes the machine's accelerator
    # and moves the model to cuda:0 even on the ranks that run on the CPU with gloo.
    world = dist.get_world_size()
    if replicas == 1:
        mesh = init_device_mesh(device.type, (world,))
    else:  # rows of the mesh replicate each other; each row shards the model over its ranks
        shape = (replicas, world // replicas)
        mesh = init_device_mesh(device.type, shape, mesh_dim_names=("replicate", "shard"))
    for module in net.modules():
        if isinstance(module, nn.Linear):
            fully_shard(module, mesh=mesh)  # each layer gathered just before it is used
    return fully_shard(net, mesh=mesh)


def fsdp_worker(
    rank: int, world: int, work: Workload, checkpointing: bool = False, replicas: int = 1
) -> dict:
    """Train with fully_shard on every linear layer and the root; optionally checkpoint each unit.

    `replicas` > 1 is HSDP: the ranks form a replicas x (world / replicas) mesh, each row shards
    the model over its ranks, and the rows' gradients are all-reduced, so that across machines
    only that all-reduce travels. Returns the full trained parameters, the local losses, held and
    peak bytes of this rank, the median step time, and one step's collectives (calls and bytes of
    the whole tensors).
    """
    worker_args.fsdp(rank, world, work, replicas)
    device = rank_device()
    once = replace(work, steps=1)  # a step on a throwaway model: the runtime's lasting buffers
    throwaway = lambda: _sharded_mlp(once, checkpointing, device, replicas)  # noqa: E731
    warm_up_once("fsdp", lambda: _data_parallel_run(throwaway(), rank, world, once, device, None))
    baseline = measured_bytes(device)
    net = _sharded_mlp(work, checkpointing, device, replicas)
    run = _data_parallel_run(net, rank, world, work, device, baseline)
    run["params"] = [full_tensor(p) for p in net.parameters()]
    run["kinds"] = sorted({type(p).__name__ for p in net.parameters()})
    return run


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
