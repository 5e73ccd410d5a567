"""The reference run the split models of lessons 10 and 11 are compared with: one device, full
batches, the lessons' optimizers."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .. import _checks


def make_optimizer(params, name: str, lr: float) -> torch.optim.Optimizer:
    """The lessons' optimizers: 'sgd' (plain) or 'adam' (two state tensors per parameter)."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    raise ValueError(f"optimizer {name!r} is not known; use 'sgd' or 'adam'")


def train_one_device(
    net: nn.Module, X: torch.Tensor, y: torch.Tensor, steps: int, lr: float, optimizer="sgd"
) -> list[float]:
    """The reference: `steps` full-batch steps of `net` (in place) on one device; the losses."""
    _checks.module("train_one_device: net", net)
    _checks.whole("train_one_device: steps", steps)
    if len(X) != len(y):
        raise ValueError(f"train_one_device: X has {len(X)} examples but y has {len(y)}")
    opt, losses = make_optimizer(net.parameters(), optimizer, lr), []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(net(X), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
