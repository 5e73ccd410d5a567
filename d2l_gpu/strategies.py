"""How the training script spreads one model over its processes (lesson 7; lessons 9 and 10).

A strategy wraps a freshly built (or resumed) model on every rank and offers the same four
operations whatever it does inside: one training step on a batch, a prediction, and the full
model and optimizer states (gathered, with the plain model's names, so that any strategy can
resume any other's checkpoint).

* ``ddp``: every rank holds the whole model; DistributedDataParallel averages the gradients.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

from .models import LeNet, init_every_layer, resnet18

__all__ = [
    "STRATEGIES",
    "DDPStrategy",
    "TrainError",
    "build_model",
    "check_sizes",
    "make_strategy",
    "shard_indices",
]


class TrainError(ValueError):
    """A job that cannot run as asked (sizes that do not fit, a loss that is no longer finite)."""


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


def check_sizes(batch_size: int, world_size: int, num_examples: int) -> None:
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


def build_model(name: str, seed: int, device: torch.device, dtype=torch.float32) -> nn.Module:
    """A freshly initialised 'lenet' or 'resnet18' on `device`, the same on every rank."""
    torch.manual_seed(seed)
    net = LeNet(seed) if name == "lenet" else init_every_layer(resnet18())  # shapes on the CPU
    return net.to(device=device, dtype=dtype)


def _plain_state(module: nn.Module) -> dict:
    """A copy on the CPU of `module`'s state dict, with plain (unwrapped) names."""
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


class DDPStrategy:
    """Data parallelism: a whole replica per rank, gradients averaged during backward."""

    name = "ddp"
    splits_data = True  # each rank trains on its own slice of every global batch

    def __init__(self, net: nn.Module, lr: float, rank: int, world: int, device: torch.device):
        self.net, self.rank, self.world, self.device = net, rank, world, device
        ids = [device.index] if device.type == "cuda" else None
        self.model = DistributedDataParallel(net, device_ids=ids)
        self.optimizer = torch.optim.SGD(net.parameters(), lr=lr)

    def train_step(self, X: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One SGD step on this rank's shard; returns (loss sum, correct) over the shard."""
        y_hat = self.model(X)
        loss = F.cross_entropy(y_hat, y)  # mean over this rank's shard; DDP averages gradients
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces gradient buckets while backward is still running
        self.optimizer.step()
        return loss.detach() * len(y), (y_hat.argmax(1) == y).sum()

    def predict(self, X: torch.Tensor) -> torch.Tensor:
        """Logits of X (no gradients; the replica is whole, so no communication)."""
        return self.net(X)

    def model_state(self) -> dict | None:
        """The full model state on rank 0 (plain names, on the CPU); None on the other ranks."""
        return _plain_state(self.net) if self.rank == 0 else None

    def optimizer_state(self) -> dict | None:
        """The optimizer state with parameters named as in the model, on rank 0; else None."""
        if self.rank != 0:
            return None
        return _named_optimizer_state(self.optimizer, self.net)

    def load_optimizer_state(self, state: dict) -> None:
        """Restore a state returned by optimizer_state (of any strategy)."""
        _load_named_optimizer_state(self.optimizer, self.net, state)


def _named_optimizer_state(optimizer: torch.optim.Optimizer, net: nn.Module) -> dict:
    """optimizer.state_dict() with each parameter's model name in place of its index."""
    names = [name for name, _ in net.named_parameters()]
    sd = optimizer.state_dict()
    state = {names[i]: {k: _full(v) for k, v in s.items()} for i, s in sd["state"].items()}
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in sd["param_groups"]]
    return {"state": state, "param_groups": groups}


def _load_named_optimizer_state(optimizer, net: nn.Module, named: dict) -> None:
    """Load a state from _named_optimizer_state into `optimizer` over `net`'s parameters."""
    index = {name: i for i, (name, _) in enumerate(net.named_parameters())}
    params = dict(net.named_parameters())
    groups = [
        {**g, "params": [index[n] for n in g["params"] if n in index]}
        for g in named["param_groups"]
    ]
    state = {
        index[n]: {k: _like(v, params[n]) if v.dim() else v for k, v in s.items()}
        for n, s in named["state"].items()
        if n in index
    }
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def _full(t):
    """The whole tensor behind `t` (a DTensor shard is gathered) on the CPU."""
    if not isinstance(t, torch.Tensor):
        return t
    full = t.full_tensor() if hasattr(t, "full_tensor") else t
    return full.detach().cpu().clone()


def _like(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """`full` laid out like `param` (this rank's shard when `param` is a DTensor)."""
    if hasattr(param, "device_mesh"):  # a DTensor: keep this rank's shard
        from torch.distributed.tensor import distribute_tensor  # noqa: PLC0415

        return distribute_tensor(full.to(param.device), param.device_mesh, param.placements)
    return full.to(param.device)


STRATEGIES = {"ddp": DDPStrategy}


def make_strategy(name: str, net: nn.Module, lr: float, rank: int, world: int, device):
    """The strategy `name` around `net` on this rank. Shown in lesson 7."""
    return STRATEGIES[name](net, lr, rank, world, device)
