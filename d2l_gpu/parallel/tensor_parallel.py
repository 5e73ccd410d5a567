"""Tensor (channel) parallelism from scratch on real processes: a linear layer split by columns
(output features) and by rows (input features), the Megatron MLP pair with one all-reduce, a
convolution split by output channels; then the same with PyTorch's `parallelize_module`.

Shown in lesson 10. Every rank holds a slice of each split layer's weights; the collectives are
autograd functions, so backward sends exactly what the chain rule needs.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from .. import _checks
from .._typed import wrap_public
from ..data.toy import toy_images
from ..distributed import dtensor_api, rank_device
from ..models import lenet_sequential, mlp
from . import worker_args
from .footprint import CollectiveCounter, measured_bytes, tensor_bytes, train_measured, warm_up_once
from .workload import Workload


class _CopyToRanks(torch.autograd.Function):
    """Forward: every rank already has x. Backward: sum the ranks' partial input gradients."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad


class _SumOverRanks(torch.autograd.Function):
    """Forward: sum the ranks' partial results. Backward: every rank gets the same gradient."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous().clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class _GatherSlices(torch.autograd.Function):
    """Forward: concatenate every rank's slice along `dim`. Backward: keep this rank's slice."""

    @staticmethod
    def forward(ctx, x, dim):
        ctx.dim, ctx.rank, ctx.size = dim, dist.get_rank(), x.shape[dim]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        return grad.narrow(ctx.dim, ctx.rank * ctx.size, ctx.size), None


def _my_slice(t: torch.Tensor, dim: int, rank: int, world: int) -> nn.Parameter:
    """Rank `rank`'s equal slice of t along dim, as a new parameter (a copy)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} does not exist among {world} ranks (0 to {world - 1})")
    if t.shape[dim] % world:
        raise ValueError(f"{t.shape[dim]} rows/channels do not split evenly over {world} ranks")
    return nn.Parameter(t.detach().chunk(world, dim=dim)[rank].clone())


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with this rank's block of output features (rows of W): no input exchange."""

    def __init__(self, full: nn.Linear, rank: int, world: int, gather: bool = True):
        super().__init__()
        self.weight = _my_slice(full.weight, 0, rank, world)
        self.bias = _my_slice(full.bias, 0, rank, world)
        self.gather = gather

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        Y = F.linear(_CopyToRanks.apply(X), self.weight, self.bias)
        return _GatherSlices.apply(Y, -1) if self.gather else Y


class RowParallelLinear(nn.Module):
    """y = sum over ranks of x_r W_r^T, then + b: this rank's block of input features."""

    def __init__(self, full: nn.Linear, rank: int, world: int):
        super().__init__()
        self.weight = _my_slice(full.weight, 1, rank, world)
        self.bias = nn.Parameter(full.bias.detach().clone())  # added once, after the sum

    def forward(self, X_part: torch.Tensor) -> torch.Tensor:
        return _SumOverRanks.apply(F.linear(X_part, self.weight)) + self.bias


class ChannelParallelConv2d(nn.Module):
    """A convolution holding this rank's block of output channels; the channels are gathered."""

    def __init__(self, full: nn.Conv2d, rank: int, world: int):
        super().__init__()
        self.weight = _my_slice(full.weight, 0, rank, world)
        self.bias = _my_slice(full.bias, 0, rank, world)
        self.stride, self.padding = full.stride, full.padding

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        Y = F.conv2d(_CopyToRanks.apply(X), self.weight, self.bias, self.stride, self.padding)
        return _GatherSlices.apply(Y, 1)


def megatron_mlp(net: nn.Sequential, rank: int, world: int) -> nn.Sequential:
    """Split each (Linear, ReLU, Linear) pair of `net`: columns, then rows; the rest replicated."""
    _checks.module("megatron_mlp: net", net, sequential=True)
    _checks.ranks("megatron_mlp", rank, world)
    units, out, i = list(net.children()), [], 0
    while i < len(units):
        pair = units[i : i + 3]
        if len(pair) == 3 and isinstance(pair[0], nn.Linear) and isinstance(pair[2], nn.Linear):
            out += [ColumnParallelLinear(pair[0], rank, world, gather=False), pair[1]]
            out.append(RowParallelLinear(pair[2], rank, world))
            i += 3
        else:
            out.append(copy.deepcopy(units[i]))
            i += 1
    return nn.Sequential(*out)


def channel_parallel_convs(net: nn.Sequential, rank: int, world: int) -> nn.Sequential:
    """Split every Conv2d of `net` by output channels; every other layer is replicated."""
    _checks.module("channel_parallel_convs: net", net, sequential=True)
    _checks.ranks("channel_parallel_convs", rank, world)
    return nn.Sequential(
        *(
            ChannelParallelConv2d(u, rank, world) if isinstance(u, nn.Conv2d) else copy.deepcopy(u)
            for u in net.children()
        )
    )


def channel_parallel_lenet(net: nn.Sequential, rank: int, world: int) -> nn.Sequential:
    """LeNet split as `split_costs` counts it: convolutions by channels, then Megatron pairs."""
    return megatron_mlp(channel_parallel_convs(net, rank, world), rank, world)


def full_parameters(net: nn.Module) -> list[torch.Tensor]:
    """Every parameter of a split net put back together (all-gathered); replicated ones as is."""
    _checks.in_group("full_parameters")
    out = []
    for module in net.children():
        for name, p in module.named_parameters(recurse=False):
            dim = {ColumnParallelLinear: 0, ChannelParallelConv2d: 0, RowParallelLinear: 1}
            d = dim.get(type(module))
            if d is None or (isinstance(module, RowParallelLinear) and name == "bias"):
                out.append(p.detach().clone())
                continue
            parts = [torch.empty_like(p) for _ in range(dist.get_world_size())]
            dist.all_gather(parts, p.detach().contiguous())
            out.append(torch.cat(parts, dim=d))
    return out


def _measured_training(kind: str, build, X, y, steps: int, lr: float, device) -> tuple:
    """The model `build()` makes, trained by `_train` and measured (its held bytes from an
    allocator where one counts them: `measured_bytes`); before the baseline, the first run of
    `kind` in this process trains a throwaway model for two steps, so that the runtime's lasting
    buffers (the math library's, gloo's) are not counted as the model's."""
    warm_up_once(kind, lambda: _train(build(), X, y, 2, lr, device, None))
    baseline = measured_bytes(device)
    net = build()
    return net, _train(net, X, y, steps, lr, device, baseline)


def _train(net, X, y, steps, lr, device, baseline) -> dict:
    """SGD on the whole batch (every rank sees all of it), measured; one step's collectives."""

    def step():
        loss = F.cross_entropy(net(X), y)
        net.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in net.parameters():
                p -= lr * p.grad
        return loss.item()

    with CollectiveCounter() as counter:  # the first step: what one step sends
        first = step()
    if steps > 1:
        run = train_measured(step, steps - 1, device, net, baseline, measure=measured_bytes)
    else:  # no step after the first: the bytes are counted
        kept = tensor_bytes(net)
        run = {"outputs": [], "held": kept, "held_by": "the tensors kept (counted)", "kept": kept}
    extra = {"losses": [first, *run["outputs"]], "calls": counter.calls, "bytes": counter.bytes}
    return {**run, **extra}


def tensor_parallel_worker(rank: int, world: int, work: Workload, model: str = "mlp") -> dict:
    """Train the split model ('mlp': Megatron pairs of work.widths; 'lenet': channel-split
    convolutions and a Megatron pair of linear layers, on toy images, with work.widths None).

    Returns the full parameters after training (gathered), the losses, the median step time,
    the collectives of one step, the bytes this rank held after the first step (measured where an
    allocator counts them; `held_by` says from what), those of the tensors it keeps (`kept`),
    and its peak.
    """
    worker_args.tensor_parallel(rank, world, work, model)
    device = rank_device()
    steps, lr, dtype, seed = work.steps, work.lr, work.dtype, work.seed
    if model == "mlp":
        X, y = work.data()
        full, split = mlp(list(work.widths), seed, dtype), megatron_mlp
    elif model == "lenet":
        X, y = toy_images(work.batch_size, seed, dtype)
        full, split = lenet_sequential(seed).to(dtype), channel_parallel_lenet
    else:
        raise ValueError(f"model {model!r} is not known; use 'mlp' or 'lenet'")
    X, y = X.to(device), y.to(device)
    full = full.to(device)

    def build() -> nn.Sequential:  # from a copy: a split may reuse the layers it does not split
        return split(copy.deepcopy(full), rank, world)

    net, run = _measured_training(f"tp-{model}", build, X, y, steps, lr, device)
    return {"params": [p.cpu() for p in full_parameters(net)], **_summary(run)}


def torch_tensor_parallel_worker(rank: int, world: int, work: Workload) -> dict:
    """The Megatron pairs with DTensor: parallelize_module, ColwiseParallel, RowwiseParallel."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    worker_args.torch_tensor_parallel(rank, world, work)
    device = rank_device()
    mesh = init_device_mesh(device.type, (world,))
    X, y = work.data()
    X, y = X.to(device), y.to(device)

    def build() -> nn.Sequential:
        net = mlp(list(work.widths), work.seed, work.dtype).to(device)
        plan = {}
        for i in range(0, len(net) - 2, 4):  # units i, i+2 form a pair (Linear, ReLU, Linear)
            plan[str(i)], plan[str(i + 2)] = ColwiseParallel(), RowwiseParallel()
        return parallelize_module(net, mesh, plan)

    net, run = _measured_training("tp-dtensor", build, X, y, work.steps, work.lr, device)
    DTensor = dtensor_api().DTensor  # noqa: N806
    full = [p.full_tensor() if isinstance(p, DTensor) else p for p in net.parameters()]
    return {
        "params": [p.detach().cpu().clone() for p in full],
        "kinds": [type(p).__name__ for p in net.parameters()],
        **_summary(run),
    }


def _summary(run: dict) -> dict:
    """The parts of a measured run that a worker returns."""
    keys = ("losses", "calls", "bytes", "held", "held_by", "kept", "peak", "seconds")
    return {key: run.get(key, float("nan")) for key in keys}


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
