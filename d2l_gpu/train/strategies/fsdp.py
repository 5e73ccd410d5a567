"""`--strategy fsdp` (lesson 7): parameters, gradients and optimizer state sharded over the
ranks (FSDP2, `torch.distributed.fsdp.fully_shard`); a layer's parameters are gathered just for
its use."""

from __future__ import annotations

import contextlib
import importlib
import warnings

import torch
from torch import nn

from ...gpt import TransformerBlock
from ...models import Residual
from ..config import TrainConfig
from .base import Strategy, needs_torch

__all__ = ["FSDPStrategy"]


def quiet_view_warning() -> None:
    """Silence FSDP2's warning that a module returned a view (the transformer's logits are one,
    a reshape of the output layer's): changing such a view in place would skip FSDP's backward
    hook, and nothing in the training script changes the logits in place."""
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")


class FSDPStrategy(Strategy):
    """Fully sharded data parallelism (FSDP2): each rank keeps 1/world of every parameter."""

    name = "fsdp"
    sharded = True

    @staticmethod
    def check(cfg: TrainConfig, world: int) -> None:
        needs_torch(2, 6, "--strategy fsdp (torch.distributed.fsdp.fully_shard)")

    def wrap(self, net: nn.Module) -> nn.Module:
        """Shard each residual block (ResNet-18) or transformer block, and the whole model."""
        fully_shard = importlib.import_module("torch.distributed.fsdp").fully_shard
        mesh_module = importlib.import_module("torch.distributed.device_mesh")
        self.mesh = mesh_module.init_device_mesh(self.device.type, (self.world,))
        quiet_view_warning()
        for module in net.modules():
            if isinstance(module, Residual | TransformerBlock):
                fully_shard(module, mesh=self.mesh)
        return fully_shard(net, mesh=self.mesh)

    @contextlib.contextmanager
    def no_sync(self):
        """FSDP2's switch: no reduce-scatter of gradients until a backward outside it."""
        self.model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)

    def close(self) -> None:
        """Let the mesh forget the group: DTensor's caches keep the mesh after the job (seen in
        PyTorch 2.13), and through it the group and gloo's threads, into interpreter shutdown."""
        registry = getattr(self.mesh, "_pg_registry", None)
        if isinstance(registry, dict):
            registry.clear()

    def predict(self, X: torch.Tensor) -> torch.Tensor:
        return self.model(X)  # gathers each layer's parameters: every rank must call it
