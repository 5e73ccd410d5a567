"""`--strategy pipeline` (lesson 7): the model cut into one stage per rank, fed micro-batches.

The stages are runs of consecutive layers of an nn.Sequential: ResNet-18 is one (its top-level
parts), and a LeNet is cut as `models.lenet_blocks` of its weights (its four layers). Rank r
holds stage r only. Every global batch is split into --microbatches micro-batches that flow
through the stages with PyTorch's GPipe schedule (`torch.distributed.pipelining`): all forwards,
then all backwards, the gradients of the micro-batches summed into those of the whole batch.
Predictions travel the same way with plain send/recv. A stage's state is renamed to the full
model's names, so it merges into the full state dict that any strategy resumes from.
"""

from __future__ import annotations

import importlib
import inspect

import torch
import torch.distributed as dist
from torch import nn

from ...distributed import full_tensor
from ...models import LeNet, lenet_blocks
from ..config import MODELS, Placement, TrainConfig, TrainError
from .base import Strategy, correct, mean_loss, named_optimizer_state, needs_torch, oriented

__all__ = ["PipelineStrategy", "cut", "layers"]

_HEADER = 8  # [ndim, size 0, size 1, ...] of a tensor sent to the next stage


def layers(net: nn.Module) -> nn.Sequential:
    """`net` as the nn.Sequential a pipeline cuts: a LeNet as its four layers (copies of its
    weights), an nn.Sequential such as ResNet-18 as it is."""
    if isinstance(net, LeNet):
        return lenet_blocks([p.detach() for p in net.params])
    if not isinstance(net, nn.Sequential):
        raise TrainError(
            f"--strategy pipeline cuts an nn.Sequential, not a {type(net).__name__}: give the "
            "model as an nn.Sequential of its layers, or use --strategy ddp or fsdp"
        )
    return net


def cut(net: nn.Sequential, stage: int, num_stages: int) -> nn.Sequential:
    """Stage `stage` of `num_stages`: consecutive layers of `net`, sharing its parameters."""
    n = len(net)
    bounds = [round(k * n / num_stages) for k in range(num_stages + 1)]
    return net[bounds[stage] : bounds[stage + 1]]  # keeps the layers' names


class PipelineStrategy(Strategy):
    """A pipeline of stages, one per rank, fed with micro-batches (GPipe schedule)."""

    name = "pipeline"
    sharded = True

    @staticmethod
    def data_parallel_size(cfg: TrainConfig, world: int) -> int:
        return 1  # every rank sees the whole global batch (only the ends use it)

    @staticmethod
    def check(cfg: TrainConfig, world: int) -> None:
        needs_torch(2, 6, "--strategy pipeline (torch.distributed.pipelining)")
        with torch.random.fork_rng(devices=[]):  # a throwaway model: the job's seed is untouched
            stages = len(layers(MODELS[cfg.model]()))
        if world > stages:
            raise TrainError(
                f"--strategy pipeline cuts {cfg.model} into at most {stages} stages (one layer "
                f"each), but this job has {world} ranks: use at most {stages} processes, or "
                "--strategy ddp or fsdp"
            )
        if cfg.accumulate > 1:
            raise TrainError(
                f"--accumulate {cfg.accumulate} is for --strategy ddp and fsdp: a pipeline already "
                "cuts each global batch into --microbatches; set those instead"
            )
        if cfg.batch_size % cfg.microbatches:
            raise TrainError(
                f"--batch-size {cfg.batch_size} does not split into --microbatches "
                f"{cfg.microbatches} equal micro-batches: use a divisor of {cfg.batch_size}"
            )

    def __init__(self, net: nn.Module, cfg: TrainConfig, where: Placement):
        super().__init__(net, cfg, where)  # wrap() below cuts this rank's stage
        self.data_rank, self.data_world = 0, 1
        pipelining = importlib.import_module("torch.distributed.pipelining")
        self._batch_size = cfg.batch_size
        stage = pipelining.PipelineStage(self.model, self.rank, self.world, self.device)
        options = {}  # the loss below is already the batch mean: no further scaling
        if "scale_grads" in inspect.signature(pipelining.ScheduleGPipe).parameters:
            options["scale_grads"] = False
        self.schedule = pipelining.ScheduleGPipe(stage, cfg.microbatches, self._loss, **options)

    def wrap(self, net: nn.Module) -> nn.Module:
        """This rank's stage of `net`; `self.full_name` maps its state's names to the model's."""
        whole = layers(net)
        self.full_name = dict(zip(whole.state_dict(), net.state_dict(), strict=True))
        return cut(whole, self.rank, self.world)

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(self.full_name[n], p) for n, p in self.model.named_parameters()]

    def _loss(self, y_hat: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """A micro-batch's share of the batch mean: summed over micro-batches it is the mean."""
        return mean_loss(y_hat, y) * (len(y) / self._batch_size)

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
        return torch.stack(losses).sum().detach() * len(y), correct(y_hat, y), len(y)

    def predict(self, X: torch.Tensor) -> torch.Tensor | None:
        """Logits on the last stage (None elsewhere); every rank must call it."""
        H = X if self.rank == 0 else self._receive()
        H = self.model(H)
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
        full = self.net.state_dict()
        mine = {
            self.full_name[k]: oriented(full_tensor(v), full[self.full_name[k]].shape)
            for k, v in self.model.state_dict().items()
        }
        return _merge_on_rank0(mine, self.rank, self.world, _union)

    def optimizer_state(self) -> dict | None:
        """The stages' optimizer states merged on rank 0 (one parameter group)."""
        mine = named_optimizer_state(self.optimizer, self.named_parameters())
        full = dict(self.net.named_parameters())
        mine["state"] = {  # per-parameter tensors (momentum, say) shaped like the full model's
            n: {k: oriented(v, full[n].shape) if torch.is_tensor(v) else v for k, v in s.items()}
            for n, s in mine["state"].items()
        }
        return _merge_on_rank0(mine, self.rank, self.world, _merge_optimizer_states)


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
