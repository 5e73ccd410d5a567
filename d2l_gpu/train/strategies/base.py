"""The base of the training script's strategies (lesson 7, `--strategy`): how one model is
spread over the job's processes.

A strategy wraps a freshly built (or resumed) model on every rank and offers the same operations
whatever it does inside: a training step on a batch, a prediction, and the full model and
optimizer states, gathered on rank 0 under the plain model's names, so that a checkpoint of any
strategy resumes under any other (the full state dict, one file, rather than the sharded files
of torch.distributed.checkpoint: the script's models are small, and one file is what the atomic
write, the resume checks and `--save` already handle). One module per strategy: ddp.py,
fsdp.py, pipeline.py; `STRATEGY_CLASSES` in this package maps each name to its class.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod

import torch
from torch import nn
from torch.nn import functional as F

from ...distributed import NeedsNewerTorch, dtensor_api, full_tensor, require_torch
from ...models import init_every_layer
from ..config import DTYPES, MODELS, Placement, TrainConfig, TrainError

__all__ = ["Strategy", "build_model", "correct", "like", "mean_loss", "needs_torch", "oriented"]


def mean_loss(y_hat: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy averaged over every prediction: one class per image, or one next character
    per place of a window (logits [B, T, V], targets [B, T])."""
    return F.cross_entropy(y_hat.flatten(0, -2), y.flatten())


def correct(y_hat: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """How many examples were predicted right; a window counts the share of its characters."""
    right = (y_hat.argmax(-1) == y).to(y_hat.dtype)
    return right.flatten(1).mean(1).sum() if y.dim() > 1 else right.sum()


def build_model(name: str, seed: int, device: torch.device, dtype=torch.float32) -> nn.Module:
    """A freshly initialised --model `name` on `device`, the same on every rank."""
    torch.manual_seed(seed)
    net = init_every_layer(MODELS[name]()) if name == "resnet18" else MODELS[name](seed)
    return net.to(device=device, dtype=dtype)  # shapes found on the CPU, then moved


def needs_torch(major: int, minor: int, what: str) -> None:
    """Raise TrainError naming `what` unless PyTorch is at least major.minor."""
    try:
        require_torch(major, minor, what)
    except NeedsNewerTorch as e:
        raise TrainError(str(e)) from None


class Strategy(ABC):
    """What every strategy offers the training loop; subclasses say how the model is wrapped."""

    name: str  # the --strategy value
    sharded = False  # True where gathering the full state needs every rank

    @staticmethod
    def check(cfg: TrainConfig, world: int) -> None:
        """Raise TrainError if this strategy cannot run job `cfg` on `world` ranks."""
        return  # a strategy that any world size can run

    @staticmethod
    def data_parallel_size(cfg: TrainConfig, world: int) -> int:
        """Into how many parts each global batch is cut (one per group of ranks that share one)."""
        return world  # data parallelism: each rank trains on its own slice of every global batch

    def __init__(self, net: nn.Module, cfg: TrainConfig, where: Placement):
        self.net, self.cfg = net, cfg
        self.rank, self.world, self.device = where.rank, where.world, where.device
        # which part of every global batch this rank trains on, and of how many; whether the
        # figures of its part count (False where another rank reports the same part)
        self.data_rank, self.data_world, self.reports = self.rank, self.world, True
        self.model = self.wrap(net)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=cfg.lr)

    @abstractmethod
    def wrap(self, net: nn.Module) -> nn.Module:
        """The module this rank trains: `net` wrapped, sharded or cut."""

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the job's tensors (--dtype)."""
        return DTYPES[self.cfg.dtype]

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """What this rank's optimizer updates, under the full model's names."""
        return list(self.net.named_parameters())

    def train_step(
        self, X: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """One SGD step on this rank's shard; (loss sum, correct, count) of what it scored."""
        if self.cfg.accumulate > 1:
            return self.accumulated_step(X, y)
        y_hat = self.model(X)
        loss = mean_loss(y_hat, y)  # mean over this rank's shard; gradients averaged
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces gradient buckets while backward is still running
        self.optimizer.step()
        return loss.detach() * len(y), correct(y_hat, y), len(y)

    def accumulated_step(self, X: torch.Tensor, y: torch.Tensor):
        """One SGD step on this rank's shard cut into --accumulate micro-batches: the gradients
        of each add up locally, and only the last backward synchronises them across ranks."""
        self.optimizer.zero_grad(set_to_none=True)
        parts = list(zip(X.chunk(self.cfg.accumulate), y.chunk(self.cfg.accumulate), strict=True))
        loss_sum, right = torch.zeros((), device=X.device, dtype=self.dtype), 0
        for i, (Xm, ym) in enumerate(parts):
            last = i == len(parts) - 1
            with contextlib.nullcontext() if last else self.no_sync():
                y_hat = self.model(Xm)
                # the micro-batch's share of the shard's mean loss: the gradients add up to it
                loss = mean_loss(y_hat, ym) * (len(ym) / len(y))
                loss.backward()
            loss_sum = loss_sum + loss.detach() * len(y)
            right = right + correct(y_hat, ym)
        self.optimizer.step()
        return loss_sum, right, len(y)

    def no_sync(self) -> contextlib.AbstractContextManager:
        """A context in which backward keeps gradients local (no all-reduce); see subclasses."""
        return contextlib.nullcontext()

    def predict(self, X: torch.Tensor) -> torch.Tensor | None:
        """Logits of X on this rank, no gradients (None where this rank has none)."""
        return self.net(X)

    def model_state(self) -> dict | None:
        """The full model state on rank 0 (plain names, on the CPU); None on the other ranks."""
        if self.rank != 0 and not self.sharded:
            return None
        state = {k: full_tensor(v) for k, v in self.net.state_dict().items()}  # may be collective
        return state if self.rank == 0 else None

    def optimizer_state(self) -> dict | None:
        """The optimizer state, parameters named as in the model, on rank 0; else None."""
        if self.rank != 0 and not self.sharded:
            return None
        state = named_optimizer_state(self.optimizer, self.named_parameters())
        return state if self.rank == 0 else None

    def load_optimizer_state(self, state: dict) -> None:
        """Restore a state returned by optimizer_state (of any strategy)."""
        load_named_optimizer_state(self.optimizer, self.named_parameters(), state)

    def close(self) -> None:
        """Drop what would keep the process group alive after the job (see leave_group)."""
        return  # nothing to drop unless a subclass holds a device mesh


def named_optimizer_state(optimizer: torch.optim.Optimizer, named: list) -> dict:
    """optimizer.state_dict() with each parameter's name (from `named`) in place of its index."""
    names = [name for name, _ in named]
    sd = optimizer.state_dict()
    state = {names[i]: {k: full_tensor(v) for k, v in s.items()} for i, s in sd["state"].items()}
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in sd["param_groups"]]
    return {"state": state, "param_groups": groups}


def load_named_optimizer_state(optimizer, named: list, state: dict) -> None:
    """Load a state from named_optimizer_state into `optimizer` over the parameters `named`."""
    index = {name: i for i, (name, _) in enumerate(named)}
    params = dict(named)
    groups = [
        {**g, "params": [index[n] for n in g["params"] if n in index]}
        for g in state["param_groups"]
    ]
    tensors = {
        index[n]: {k: like(v, params[n]) if v.dim() else v for k, v in s.items()}
        for n, s in state["state"].items()
        if n in index
    }
    optimizer.load_state_dict({"state": tensors, "param_groups": groups})


def like(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """`full` laid out like `param`: this rank's shard of a DTensor, a transposed copy's layout."""
    if hasattr(param, "device_mesh"):  # a DTensor: keep this rank's shard
        return dtensor_api().distribute_tensor(
            full.to(param.device), param.device_mesh, param.placements
        )
    return oriented(full, param.shape).to(param.device)


def oriented(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """`t` with `shape`: a matrix stored the other way round (nn.Linear's W^T) is transposed."""
    return t.T.contiguous() if t.dim() == 2 and t.shape != shape else t
