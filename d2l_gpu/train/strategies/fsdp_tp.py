"""`--strategy fsdp-tp` (lesson 7; lesson 14 builds the same mesh step by step): --model
transformer on a two-dimensional device mesh.

The world's ranks form a grid of world/tp rows and --tp columns. The tp ranks of a row split
each block's attention heads and MLP between them, Megatron style
(`parallel.transformer_parallel.parallelize_transformer`: one all-reduce per sub-layer, forward
and backward), so they must see the same examples: the row trains on one part of every global
batch. The ranks of a column hold the same slices of the blocks and shard them further over the
row dimension with FSDP2, each row on its own part of the batch. Tensor parallelism talks at
every sub-layer: on GPUs its ranks belong inside one machine (torchrun numbers a machine's ranks
consecutively, and consecutive ranks form a row here).

The blocks keep qkv's rows grouped by rank (`group_qkv`); the full states this strategy gathers
put them back in the model's order, so its checkpoints resume under any strategy and any --tp.
Ran only on gloo CPU processes.
"""

from __future__ import annotations

import importlib

import torch
from torch import nn

from ...parallel.mesh import split_over_mesh
from ...parallel.transformer_parallel import group_qkv, ungroup_qkv
from ..config import MODELS, TrainConfig, TrainError
from .base import needs_torch
from .fsdp import FSDPStrategy, quiet_view_warning

__all__ = ["FSDPTPStrategy"]


class FSDPTPStrategy(FSDPStrategy):
    """Tensor parallelism over --tp ranks, FSDP2 over the rest: a 2-D mesh ("dp", "tp")."""

    name = "fsdp-tp"

    @staticmethod
    def check(cfg: TrainConfig, world: int) -> None:
        needs_torch(2, 6, "--strategy fsdp-tp (DTensor's parallelize_module and fully_shard)")
        if world % cfg.tp:
            raise TrainError(
                f"--tp {cfg.tp} does not divide the world size {world}: the ranks form rows of "
                f"--tp ranks; use --tp {world} or a divisor of it, or a multiple of {cfg.tp} ranks"
            )
        with torch.random.fork_rng(devices=[]):  # a throwaway model: the job's seed is untouched
            block = MODELS[cfg.model]()[1]
        heads, hidden = block.num_heads, block.fc1.out_features
        if heads % cfg.tp or hidden % cfg.tp:
            raise TrainError(
                f"--tp {cfg.tp} ranks cannot share the {heads} attention heads and {hidden} MLP "
                f"units of --model {cfg.model} evenly: use a --tp that divides {heads}"
            )

    @staticmethod
    def data_parallel_size(cfg: TrainConfig, world: int) -> int:
        return world // cfg.tp  # one part of every global batch per row of the mesh

    def wrap(self, net: nn.Module) -> nn.Module:
        """Split the blocks over "tp", then shard each block and the whole model over "dp"."""
        mesh_module = importlib.import_module("torch.distributed.device_mesh")
        rows, tp = self.world // self.cfg.tp, self.cfg.tp
        self.mesh = mesh_module.init_device_mesh(
            self.device.type, (rows, tp), mesh_dim_names=("dp", "tp")
        )
        quiet_view_warning()
        self.data_rank, self.data_world = self.mesh.get_local_rank("dp"), rows
        self.reports = self.mesh.get_local_rank("tp") == 0  # a row's ranks score the same examples
        return split_over_mesh(net, self.mesh)

    def _qkv(self, name: str, t, regroup):
        """Tensor `t` of parameter `name`, passed through `regroup` if it is laid out like qkv."""
        if ".qkv." in name and torch.is_tensor(t) and t.dim():
            return regroup(t, self.cfg.tp)
        return t

    def model_state(self) -> dict | None:
        """The full model state on rank 0, qkv's rows in the model's own order."""
        state = super().model_state()
        return (
            None if state is None else {k: self._qkv(k, v, ungroup_qkv) for k, v in state.items()}
        )

    def optimizer_state(self) -> dict | None:
        """The optimizer state as any strategy stores it (qkv's rows in the model's order)."""
        state = super().optimizer_state()
        return None if state is None else self._per_parameter(state, ungroup_qkv)

    def load_optimizer_state(self, state: dict) -> None:
        super().load_optimizer_state(self._per_parameter(state, group_qkv))

    def _per_parameter(self, state: dict, regroup) -> dict:
        """An optimizer state (named_optimizer_state's form) with qkv's tensors regrouped."""
        tensors = {
            name: {k: self._qkv(name, v, regroup) for k, v in per.items()}
            for name, per in state["state"].items()
        }
        return {**state, "state": tensors}
