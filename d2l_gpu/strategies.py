"""How the training script spreads one model over its processes (lesson 7, `--strategy`).

A strategy wraps a freshly built (or resumed) model on every rank and offers the same operations
whatever it does inside: a training step on a batch, a prediction, and the full model and
optimizer states, gathered on rank 0 under the plain model's names, so that a checkpoint of any
strategy resumes under any other (the full state dict, one file, rather than the sharded files
of torch.distributed.checkpoint: the script's models are small, and one file is what the atomic
write, the resume checks and `--save` already handle).

* ``ddp``: every rank holds the whole model; DistributedDataParallel averages the gradients.
* ``fsdp``: parameters, gradients and optimizer state sharded over the ranks (FSDP2,
  ``torch.distributed.fsdp.fully_shard``): a layer's parameters are gathered just for its use.
* ``pipeline``: the model cut into one stage of consecutive layers per rank, micro-batches flowing
  through (``torch.distributed.pipelining``, the GPipe schedule); see pipeline.py.
"""

from __future__ import annotations

import importlib
import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from .distributed import torch_version
from .models import LeNet, Residual, init_every_layer, resnet18

__all__ = [
    "STRATEGIES",
    "DDPStrategy",
    "FSDPStrategy",
    "Strategy",
    "TrainError",
    "build_model",
    "check_sizes",
    "evaluate",
    "make_strategy",
    "shard_indices",
    "strategy_class",
    "train_epoch",
]

STRATEGIES = ("ddp", "fsdp", "pipeline")
DTYPES = {"float32": torch.float32, "float64": torch.float64}


class TrainError(ValueError):
    """A job that cannot run as asked (sizes that do not fit, a loss that is no longer finite)."""


def shard_indices(
    num_examples: int, batch_size: int, epoch: int, seed: int, rank: int, world_size: int
) -> torch.Tensor:
    """Rank `rank`'s slice of every full global batch of `epoch`: (num_batches, batch/world)."""
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)  # same order on every rank
    order = torch.randperm(num_examples, generator=g)
    num_batches = num_examples // batch_size  # the last, incomplete global batch is dropped
    per_rank = batch_size // world_size
    return order[: num_batches * batch_size].view(num_batches, world_size, per_rank)[:, rank]


def check_sizes(batch_size: int, world_size: int, num_examples: int) -> None:
    """Raise TrainError unless the global batch splits evenly and every rank gets examples.

    Shown in lesson 7."""
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
    """A freshly initialised 'lenet' or 'resnet18' on `device`, the same on every rank.

    Shown in lesson 7."""
    torch.manual_seed(seed)
    net = LeNet(seed) if name == "lenet" else init_every_layer(resnet18())  # shapes on the CPU
    return net.to(device=device, dtype=dtype)


def needs_torch(major: int, minor: int, what: str) -> None:
    """Raise TrainError naming `what` unless PyTorch is at least major.minor (lesson 7)."""
    if torch_version() < (major, minor):
        raise TrainError(
            f"{what} needs PyTorch {major}.{minor} or newer; this is {torch.__version__}"
        )


class Strategy:
    """Data parallelism with DistributedDataParallel; the base of the other strategies."""

    name = "ddp"
    splits_data = True  # each rank trains on its own slice of every global batch
    sharded = False  # True where gathering the full state needs every rank

    @staticmethod
    def check(cfg, world: int) -> None:
        """Raise TrainError if this strategy cannot run job `cfg` on `world` ranks."""

    def __init__(self, net: nn.Module, cfg, rank: int, world: int, device: torch.device):
        self.net, self.rank, self.world, self.device = net, rank, world, device
        self.model = self.wrap(net, device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=cfg.lr)

    def wrap(self, net: nn.Module, device: torch.device) -> nn.Module:
        """The module whose forward trains: here DDP around `net`."""
        return DistributedDataParallel(
            net, device_ids=[device.index] if device.type == "cuda" else None
        )

    def train_step(
        self, X: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """One SGD step on this rank's shard; (loss sum, correct, count) of what it scored."""
        y_hat = self.model(X)
        loss = F.cross_entropy(y_hat, y)  # mean over this rank's shard; gradients averaged
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces gradient buckets while backward is still running
        self.optimizer.step()
        return loss.detach() * len(y), (y_hat.argmax(1) == y).sum(), len(y)

    def predict(self, X: torch.Tensor) -> torch.Tensor | None:
        """Logits of X on this rank, no gradients (None where this rank has none)."""
        return self.net(X)

    def model_state(self) -> dict | None:
        """The full model state on rank 0 (plain names, on the CPU); None on the other ranks."""
        if self.rank != 0 and not self.sharded:
            return None
        state = {k: _full(v) for k, v in self.net.state_dict().items()}  # sharded: collective
        return state if self.rank == 0 else None

    def optimizer_state(self) -> dict | None:
        """The optimizer state, parameters named as in the model, on rank 0; else None."""
        if self.rank != 0 and not self.sharded:
            return None
        state = _named_optimizer_state(self.optimizer, self.net)
        return state if self.rank == 0 else None

    def load_optimizer_state(self, state: dict) -> None:
        """Restore a state returned by optimizer_state (of any strategy)."""
        _load_named_optimizer_state(self.optimizer, self.net, state)

    def close(self) -> None:
        """Drop what would keep the process group alive after the job (see leave_group)."""


DDPStrategy = Strategy


class FSDPStrategy(Strategy):
    """Fully sharded data parallelism (FSDP2): each rank keeps 1/world of every parameter."""

    name = "fsdp"
    sharded = True

    @staticmethod
    def check(cfg, world: int) -> None:
        needs_torch(2, 6, "--strategy fsdp (torch.distributed.fsdp.fully_shard)")

    def wrap(self, net: nn.Module, device: torch.device) -> nn.Module:
        """Shard each residual block (ResNet-18) and the whole model, in place."""
        fully_shard = importlib.import_module("torch.distributed.fsdp").fully_shard
        mesh_module = importlib.import_module("torch.distributed.device_mesh")
        self.mesh = mesh_module.init_device_mesh(device.type, (self.world,))
        for module in net.modules():
            if isinstance(module, Residual):
                fully_shard(module, mesh=self.mesh)
        return fully_shard(net, mesh=self.mesh)

    def close(self) -> None:
        """Let the mesh forget the group: DTensor's caches keep the mesh after the job (seen in
        PyTorch 2.13), and through it the group and gloo's threads, into interpreter shutdown."""
        registry = getattr(self.mesh, "_pg_registry", None)
        if isinstance(registry, dict):
            registry.clear()

    def predict(self, X: torch.Tensor) -> torch.Tensor:
        return self.model(X)  # gathers each layer's parameters: every rank must call it


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


def strategy_class(name: str) -> type[Strategy]:
    """The class of strategy `name` ('ddp', 'fsdp' or 'pipeline'). Shown in lesson 7."""
    if name == "pipeline":
        return importlib.import_module(".pipeline_strategy", __package__).PipelineStrategy
    return {"ddp": Strategy, "fsdp": FSDPStrategy}[name]


def make_strategy(name: str, net: nn.Module, cfg, rank: int, world: int, device) -> Strategy:
    """Strategy `name` around `net` for job `cfg` on this rank. Shown in lesson 7."""
    return strategy_class(name)(net, cfg, rank, world, device)


class _Bar(tqdm):
    """tqdm without its monitor thread: no thread of ours outlives the job."""

    monitor_interval = 0


def _batch(X: torch.Tensor, y: torch.Tensor, idx: torch.Tensor, dtype: torch.dtype):
    """Images idx of X as (B,1,28,28) floats in [0,1], with their labels."""
    return X[idx].unsqueeze(1).to(dtype).div_(255), y[idx]


def train_epoch(strategy: Strategy, X, y, epoch: int, cfg, rank: int, world: int) -> torch.Tensor:
    """One epoch of SGD steps of job `cfg`; [loss sum, correct, count] on this rank (not yet
    summed over ranks). Shown in lesson 7."""
    metric = torch.zeros(3, dtype=torch.float64, device=X.device)
    shard_rank, shard_world = (rank, world) if strategy.splits_data else (0, 1)
    shards = shard_indices(len(y), cfg.batch_size, epoch, cfg.seed, shard_rank, shard_world)
    quiet = rank != 0 or (None if cfg.progress is None else not cfg.progress)
    bar = _Bar(total=len(shards), desc=f"epoch {epoch + 1}", unit="step", leave=False,
               disable=quiet, file=sys.stderr)  # fmt: skip
    with bar:
        for idx in shards.to(X.device):
            Xb, yb = _batch(X, y, idx, DTYPES[cfg.dtype])
            loss_sum, correct, count = strategy.train_step(Xb, yb)
            with torch.no_grad():
                metric[0] += loss_sum  # kept on the device: no host sync inside the loop
                metric[1] += correct
                metric[2] += count
            bar.update()
    return metric


def evaluate(strategy: Strategy, X, y, cfg, rank: int, world: int) -> torch.Tensor:
    """[correct, count] of this rank's part of the test set (not yet summed over ranks); every
    rank calls it. Shown in lesson 7."""
    metric = torch.zeros(2, dtype=torch.float64, device=X.device)
    with torch.no_grad():
        strategy.net.eval()
        for chunk in torch.arange(len(y), device=X.device).split(cfg.batch_size):
            mine = chunk[rank::world] if strategy.splits_data else chunk
            Xb, yb = _batch(X, y, mine, DTYPES[cfg.dtype])
            y_hat = strategy.predict(Xb)  # collective for some strategies: every rank calls it
            if y_hat is not None:
                metric[0] += (y_hat.argmax(1) == yb).sum()
                metric[1] += len(yb)
        strategy.net.train()
    return metric
