"""Where a model's training memory goes (parameters, gradients, optimizer state, activations),
what each rank keeps under data parallelism and ZeRO, and activation checkpointing.

Shown in lesson 11. The counts work on PyTorch's `meta` device too, so a model of any size can
be counted without memory or arithmetic.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .. import _checks
from .._typed import wrap_public

# numbers of optimizer state per parameter: SGD none, SGD with momentum one, Adam two
OPTIMIZER_STATES = {"sgd": 0, "momentum": 1, "adam": 2}


def activation_bytes(net: nn.Module, X: torch.Tensor) -> int:
    """Bytes autograd keeps from net(X) for the backward pass (parameters not counted)."""
    params = {p.untyped_storage()._cdata for p in net.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        if storage._cdata not in params:  # one storage may be saved by several operations
            kept[storage._cdata] = storage.nbytes()
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(X)
    return sum(kept.values())


def memory_breakdown(net: nn.Module, X: torch.Tensor, optimizer: str = "adam") -> dict[str, int]:
    """Bytes of parameters, gradients, optimizer state, and activations for a batch X."""
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError(
            f"optimizer {optimizer!r} is not known; use one of {list(OPTIMIZER_STATES)}"
        )
    P = sum(p.numel() * p.element_size() for p in net.parameters())
    return {
        "parameters": P,
        "gradients": P,
        "optimizer state": OPTIMIZER_STATES[optimizer] * P,
        "activations": activation_bytes(net, X),
    }


def bytes_per_rank(breakdown: dict[str, int], k: int, stage: int = 0) -> dict[str, float]:
    """What each of k data-parallel ranks keeps under ZeRO `stage` (0: plain data parallelism).

    Each rank computes on 1/k of the batch, so it keeps 1/k of the activations at any stage.
    """
    if not isinstance(breakdown, dict):
        raise TypeError(
            f"bytes_per_rank: breakdown must be the dict d2l.memory_breakdown returns, got "
            f"{breakdown!r}"
        )
    _checks.whole("bytes_per_rank: k", k)
    _checks.whole("bytes_per_rank: stage", stage, least=0)
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage {stage} does not exist; use 0 (plain), 1, 2 or 3")
    sharded = {1: ["optimizer state"], 2: ["optimizer state", "gradients"]}
    sharded[3] = [*sharded[2], "parameters"]
    cut = set(sharded.get(stage, [])) | {"activations"}
    return {key: value / k if key in cut else value for key, value in breakdown.items()}


class Checkpointed(nn.Module):
    """Runs `module` without keeping its activations; backward runs its forward pass again."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = _checks.module("Checkpointed: module", module)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return self.module(X)
        return checkpoint(self.module, X, use_reentrant=False)


def checkpoint_every(net: nn.Sequential, every: int = 1) -> nn.Sequential:
    """The same units (shared, not copied), each group of `every` units checkpointed."""
    units = list(_checks.module("checkpoint_every: net", net, sequential=True).children())
    _checks.whole("checkpoint_every: every", every)
    groups = [units[i : i + every] for i in range(0, len(units), every)]
    return nn.Sequential(*(Checkpointed(nn.Sequential(*g)) for g in groups))


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
