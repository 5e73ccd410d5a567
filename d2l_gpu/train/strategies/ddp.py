"""`--strategy ddp` (lesson 7): every rank holds the whole model; DistributedDataParallel
averages the gradients while the backward pass runs."""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ...parallel.sync_batchnorm import sync_batchnorm
from .base import Strategy

__all__ = ["DDPStrategy"]


class DDPStrategy(Strategy):
    """Data parallelism with DistributedDataParallel: the whole model on every rank."""

    name = "ddp"

    def wrap(self, net: nn.Module) -> nn.Module:
        """DDP around `net`; with --sync-bn its BatchNorm layers are synchronised first."""
        device = self.device
        if self.cfg.sync_bn:  # each layer's mean and variance over every rank's part of a batch
            net = sync_batchnorm(net, device)  # SyncBatchNorm on CUDA, GlobalBatchNorm elsewhere
        return DistributedDataParallel(
            net, device_ids=[device.index] if device.type == "cuda" else None
        )

    def no_sync(self):
        """DDP's own: gradients stay on this rank until a backward outside it."""
        return self.model.no_sync()
