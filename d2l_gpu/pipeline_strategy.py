"""The pipeline strategy of the training script (`--strategy pipeline`, lesson 7).

The model is cut into as many stages as there are ranks, each a run of consecutive layers
(LeNet: its 4 layers; ResNet-18: its 9 top-level parts). Rank r holds stage r only. Every global
batch is split into --microbatches micro-batches that flow through the stages with PyTorch's
GPipe schedule (`torch.distributed.pipelining`): all forwards, then all backwards, the gradients
of the micro-batches summed into those of the whole batch. Predictions travel the same way with
plain send/recv. Each stage keeps the full model's parameter names, so its state merges into the
full state dict that any strategy resumes from.
"""

from __future__ import annotations

import importlib
import inspect
from collections import OrderedDict

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from .models import LeNet
from .strategies import (
    Strategy,
    TrainError,
    _load_named_optimizer_state,
    _named_optimizer_state,
    needs_torch,
)

__all__ = ["PipelineStrategy", "cut", "layers_of"]

_HEADER = 8  # [ndim, size 0, size 1, ...] of a tensor sent to the next stage


def _lenet_layer(i: int, X: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Layer i of d2l_gpu.models.lenet, the same operations in the same order."""
    if i < 2:
        H = F.avg_pool2d(F.relu(F.conv2d(X, W, b)), kernel_size=(2, 2), stride=(2, 2))
        return H.reshape(H.shape[0], -1) if i == 1 else H
    H = torch.mm(X, W) + b
    return F.relu(H) if i == 2 else H


class LeNetStage(nn.Module):
    """Layers first..last-1 of a LeNet, sharing its parameters and keeping their names."""

    def __init__(self, net: LeNet, first: int, last: int):
        super().__init__()
        self.layers = list(range(first, last))
        self.params = nn.Module()
        for i in range(2 * first, 2 * last):
            self.params.register_parameter(str(i), net.params[i])

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        for i in self.layers:
            X = _lenet_layer(
                i, X, getattr(self.params, str(2 * i)), getattr(self.params, str(2 * i + 1))
            )
        return X


def layers_of(net: nn.Module) -> int:
    """How many stages `net` can be cut into: one layer (or top-level part) each at most.

    Shown in lesson 7 (`--strategy pipeline`)."""
    return 4 if isinstance(net, LeNet) else len(list(net.children()))


def cut(net: nn.Module, stage: int, num_stages: int) -> nn.Module:
    """Stage `stage` of `num_stages`: consecutive layers of `net`, sharing its parameters.

    Shown in lesson 7 (`--strategy pipeline`)."""
    n = layers_of(net)
    bounds = [round(k * n / num_stages) for k in range(num_stages + 1)]
    first, last = bounds[stage], bounds[stage + 1]
    if isinstance(net, LeNet):
        return LeNetStage(net, first, last)
    return nn.Sequential(OrderedDict(list(net.named_children())[first:last]))


class PipelineStrategy(Strategy):
    """A pipeline of stages, one per rank, fed with micro-batches (GPipe schedule)."""

    name = "pipeline"
    splits_data = False  # every rank sees the whole global batch (only the ends use it)
    sharded = True

    @staticmethod
    def check(cfg, world: int) -> None:
        needs_torch(2, 6, "--strategy pipeline (torch.distributed.pipelining)")
        stages = 4 if cfg.model == "lenet" else 9
        if world > stages:
            raise TrainError(
                f"--strategy pipeline cuts {cfg.model} into at most {stages} stages (one layer "
                f"each), but this job has {world} ranks: use at most {stages} processes, or "
                "--strategy ddp or fsdp"
            )
        if cfg.batch_size % cfg.microbatches:
            raise TrainError(
                f"--batch-size {cfg.batch_size} does not split into --microbatches "
                f"{cfg.microbatches} equal micro-batches: use a divisor of {cfg.batch_size}"
            )

    def __init__(self, net: nn.Module, cfg, rank: int, world: int, device: torch.device):
        pipelining = importlib.import_module("torch.distributed.pipelining")
        self.net, self.rank, self.world, self.device = net, rank, world, device
        self.stage_module = cut(net, rank, world)
        self.model = self.stage_module
        self.optimizer = torch.optim.SGD(self.stage_module.parameters(), lr=cfg.lr)
        self.dtype = next(net.parameters()).dtype
        self._batch_size = cfg.batch_size
        stage = pipelining.PipelineStage(self.stage_module, rank, world, device)
        options = {}  # the loss below is already the batch mean: no further scaling
        if "scale_grads" in inspect.signature(pipelining.ScheduleGPipe).parameters:
            options["scale_grads"] = False
        self.schedule = pipelining.ScheduleGPipe(stage, cfg.microbatches, self._loss, **options)

    def _loss(self, y_hat: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """A micro-batch's share of the batch mean: summed over micro-batches it is the mean."""
        return F.cross_entropy(y_hat, y, reduction="sum") / self._batch_size

    def train_step(self, X: torch.Tensor, y: torch.Tensor):
        """One SGD step of the whole global batch; (loss sum, correct, count) on the last stage."""
        first, last = self.rank == 0, self.rank == self.world - 1
        self._batch_size = len(y)
        self.optimizer.zero_grad(set_to_none=True)
        losses: list[torch.Tensor] = []
        args = (X,) if first else ()
        kwargs = {"target": y, "losses": losses} if last else {}
        y_hat = self.schedule.step(*args, **kwargs)
        self.optimizer.step()
        if not last:
            zero = torch.zeros((), device=X.device)
            return zero, zero, 0  # only the last stage sees the loss
        return torch.stack(losses).sum().detach() * len(y), (y_hat.argmax(1) == y).sum(), len(y)

    def predict(self, X: torch.Tensor) -> torch.Tensor | None:
        """Logits on the last stage (None elsewhere); every rank must call it."""
        H = X if self.rank == 0 else self._receive()
        H = self.stage_module(H)
        if self.rank == self.world - 1:
            return H
        header = torch.full((_HEADER,), -1, dtype=torch.int64)
        header[0], header[1 : 1 + H.dim()] = H.dim(), torch.tensor(H.shape)
        dist.send(header.to(self.device), self.rank + 1)
        dist.send(H.contiguous(), self.rank + 1)
        return None

    def _receive(self) -> torch.Tensor:
        header = torch.empty(_HEADER, dtype=torch.int64, device=self.device)
        dist.recv(header, self.rank - 1)
        shape = header[1 : 1 + int(header[0])].tolist()
        H = torch.empty(shape, dtype=self.dtype, device=self.device)
        dist.recv(H, self.rank - 1)
        return H

    def model_state(self) -> dict | None:
        """The stages' states merged on rank 0: the full model's state dict."""
        mine = {k: v.detach().cpu().clone() for k, v in self.stage_module.state_dict().items()}
        return _merge_on_rank0(mine, self.rank, self.world, _union)

    def optimizer_state(self) -> dict | None:
        """The stages' optimizer states merged on rank 0 (one parameter group)."""
        mine = _named_optimizer_state(self.optimizer, self.stage_module)
        return _merge_on_rank0(mine, self.rank, self.world, _merge_optimizer_states)

    def load_optimizer_state(self, state: dict) -> None:
        """This stage's part of a full optimizer state (of any strategy)."""
        _load_named_optimizer_state(self.optimizer, self.stage_module, state)


def _merge_on_rank0(mine, rank: int, world: int, merge):
    """Gather every rank's `mine` on rank 0 and merge them there; None on the other ranks."""
    parts = [None] * world if rank == 0 else None
    dist.gather_object(mine, parts, dst=0)
    return merge(parts) if rank == 0 else None


def _union(parts: list[dict]) -> dict:
    return {k: v for part in parts for k, v in part.items()}


def _merge_optimizer_states(parts: list[dict]) -> dict:
    group = dict(parts[0]["param_groups"][0])
    group["params"] = [n for p in parts for g in p["param_groups"] for n in g["params"]]
    return {"state": _union([p["state"] for p in parts]), "param_groups": [group]}
