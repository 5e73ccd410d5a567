"""ZeRO from scratch on real processes: data parallelism whose optimizer state (stage 1), gradients
(stage 2) and parameters (stage 3) are cut into one shard per rank, with reduce-scatter and
all-gather; Adam written out so that every byte it keeps is visible.

Shown in lesson 11. `zero_worker` trains an MLP with a given stage and returns the trained
parameters, the bytes each rank held and peaked at (measured: on a CPU from the C heap), the bytes
of the tensors it keeps (counted), and the collectives of one step.
"""

from __future__ import annotations

import contextlib
import functools
import math

import torch
import torch.distributed as dist
from torch.nn import functional as F

from .. import _checks
from .._typed import wrap_public
from ..distributed import rank_device
from ..models import mlp
from . import worker_args
from .footprint import CollectiveCounter, measured_bytes, train_measured, warm_up_once
from .workload import Workload

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class ShardedLayer:
    """One linear layer's weight and bias as one flat vector, padded to k equal shards."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, stage: int, rank: int, k: int):
        if stage not in (0, 1, 2, 3) or not 0 <= rank < k:
            raise ValueError(f"ShardedLayer: stage 0-3, rank 0-{k - 1} exist, got {stage}, {rank}")
        self.shape, self.stage, self.rank, self.k = tuple(weight.shape), stage, rank, k
        flat = torch.cat([weight.detach().reshape(-1), bias.detach()])
        self.numel = flat.numel()
        self.shard_size = math.ceil(self.numel / k)
        padded = torch.zeros(self.shard_size * k, dtype=flat.dtype, device=flat.device)
        padded[: self.numel] = flat
        mine = padded[rank * self.shard_size : (rank + 1) * self.shard_size]
        # stage 3 keeps only its shard of the parameters; the others keep all of them
        self.params = mine.clone() if stage == 3 else padded
        self.params.requires_grad_()  # only so that autograd calls our backward
        # stages 2 and 3 keep only their shard of the gradient; 0 and 1 keep all of it
        self.grad = torch.zeros_like(mine if stage >= 2 else padded)
        optimized = self.params if stage == 0 else mine  # the numbers this rank's Adam updates
        self.m, self.v = torch.zeros_like(optimized), torch.zeros_like(optimized)

    def full(self) -> torch.Tensor:
        """The whole flat vector: gathered from every rank's shard (stage 3), or the one we keep."""
        if self.stage < 3:
            return self.params.detach()
        p = self.params.detach()
        out = torch.empty(self.shard_size * self.k, dtype=p.dtype, device=p.device)
        _all_gather(out, p)
        return out

    def weight_bias(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of the weight and the bias inside a flat vector."""
        n = self.shape[0] * self.shape[1]
        return flat[:n].view(self.shape), flat[n : self.numel]

    def add_grad(self, flat_grad: torch.Tensor) -> None:
        """Keep a layer's gradient: all of it (stages 0, 1) or our reduce-scattered shard (2, 3)."""
        if self.stage < 2:
            self.grad += flat_grad
        else:
            shard = torch.empty_like(self.grad)
            _reduce_scatter(shard, flat_grad)  # sums over ranks; each rank keeps its slice
            self.grad += shard


class _ShardedLinear(torch.autograd.Function):
    """y = x W^T + b, with W and b gathered when needed and the gradient handed to the layer."""

    @staticmethod
    def forward(ctx, x, anchor, layer):
        W, b = layer.weight_bias(layer.full())  # stage 3: gathered now, freed after this call
        ctx.save_for_backward(x)
        ctx.layer = layer
        return x @ W.T + b

    @staticmethod
    def backward(ctx, grad_y):
        (x,) = ctx.saved_tensors
        layer = ctx.layer
        flat = layer.full()  # stage 3: gathered again, for the input's gradient
        W, _ = layer.weight_bias(flat)
        grad_x = grad_y @ W if ctx.needs_input_grad[0] else None
        flat_grad = torch.zeros_like(flat)
        gW, gb = layer.weight_bias(flat_grad)
        gW += grad_y.T @ x
        gb += grad_y.sum(0)
        layer.add_grad(flat_grad)
        return grad_x, None, None


def adam_step(
    p: torch.Tensor,
    g: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    step: int,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> None:
    """Adam on flat tensors, in place, in the order torch.optim.Adam computes it."""
    if step < 1:
        raise ValueError(f"adam_step counts steps from 1 (its bias correction), got step={step}")
    b1, b2 = betas
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    denom = (v.sqrt() / math.sqrt(1 - b2**step)).add_(eps)
    p.addcdiv_(m, denom, value=-lr / (1 - b1**step))


def zero_step(layers: list[ShardedLayer], X, y, step: int, lr: float) -> float:
    """Forward, backward and the sharded Adam update of one data-parallel step; the local loss."""
    h = X
    for i, layer in enumerate(layers):
        h = _ShardedLinear.apply(h, layer.params, layer)
        if i < len(layers) - 1:
            h = F.relu(h)
    loss = F.cross_entropy(h, y)
    loss.backward()
    k = layers[0].k
    for layer in layers:
        r, size = layer.rank, layer.shard_size
        mine = slice(r * size, (r + 1) * size)
        with torch.no_grad():
            if layer.stage == 0:  # plain data parallelism: everyone sums everything
                dist.all_reduce(layer.grad)
                adam_step(layer.params, layer.grad / k, layer.m, layer.v, step, lr)
            elif layer.stage == 1:  # sum, but only our slice: we update only that
                shard = torch.empty(size, dtype=layer.grad.dtype, device=layer.grad.device)
                _reduce_scatter(shard, layer.grad)
                adam_step(layer.params[mine], shard / k, layer.m, layer.v, step, lr)
            else:  # stages 2 and 3: the gradient shard is already summed
                own = layer.params if layer.stage == 3 else layer.params[mine]
                adam_step(own, layer.grad / k, layer.m, layer.v, step, lr)
            if layer.stage in (1, 2):  # everyone needs every updated parameter next step
                # detach(): on PyTorch 2.4 gloo writes from its own thread, where autograd
                # refuses in-place writes to views of a tensor that requires grad
                _all_gather(layer.params.detach(), layer.params[mine].clone())
            layer.grad.zero_()
    return loss.item()


def _layers(widths, stage, rank, k, dtype, seed, device) -> list[ShardedLayer]:
    """Every rank builds the same seeded MLP and keeps what its ZeRO stage allows."""
    net = mlp(widths, seed, dtype).to(device)
    linears = [u for u in net if isinstance(u, torch.nn.Linear)]
    return [ShardedLayer(lin.weight, lin.bias, stage, rank, k) for lin in linears]


def zero_worker(
    rank: int, world: int, work: Workload, stage: int, add_grad: str | None = None
) -> dict:
    """Train `work` with ZeRO stage 0 (plain data parallelism), 1, 2 or 3 from scratch, with Adam.

    Returns the full trained parameters (weight, bias per layer), the local losses, the bytes
    this rank holds (measured; `held_by` says from what) and of the tensors it keeps (`kept`,
    counted), its peak, the median step time, and one step's collectives. Before the baseline
    of the measurement, the first worker of a process runs one step on throwaway layers, so
    that the runtime makes its own lasting buffers (on the CPU of lesson 11's run, the first
    matrix product alone leaves 10.5 MiB, the math library's). `add_grad`, for stages 2 and 3,
    is the source of a function f(layer, flat_grad) that replaces `ShardedLayer.add_grad`
    (lesson 11's exercise 4 sends a student's version as text).
    """
    worker_args.zero(rank, world, work, stage, add_grad)
    device = rank_device()
    widths, steps, lr, dtype, seed = work.widths, work.steps, work.lr, work.dtype, work.seed
    X, y = work.data()
    X, y = X.tensor_split(world)[rank].to(device), y.tensor_split(world)[rank].to(device)
    add = worker_args.source_function(add_grad, F=F) if add_grad is not None else None

    def build() -> list[ShardedLayer]:
        layers = _layers(widths, stage, rank, world, dtype, seed, device)
        for layer in layers if add is not None else ():
            layer.add_grad = functools.partial(add, layer)
        return layers

    warm_up_once("zero", lambda: zero_step(build(), X, y, 1, lr))  # layers thrown away at once
    baseline = measured_bytes(device)
    layers = build()
    counter, count = CollectiveCounter(), [0]

    def step():
        count[0] += 1
        with counter if count[0] == 1 else contextlib.nullcontext():  # what one step sends
            return zero_step(layers, X, y, count[0], lr)

    run = train_measured(step, steps, device, layers, baseline, measure=measured_bytes)
    params = []
    for layer in layers:
        W, b = layer.weight_bias(layer.full())
        params += [W.detach().cpu().clone(), b.detach().cpu().clone()]
    keys = ("held", "held_by", "kept", "peak", "seconds")
    return {"params": params, "losses": run["outputs"], "calls": counter.calls,
            "bytes": counter.bytes, **{key: run[key] for key in keys}}  # fmt: skip


def zero_stages_worker(
    rank: int, world: int, work: Workload, stages: list[int], add_grad: str | None = None
) -> list[dict]:
    """`zero_worker` for each ZeRO stage in `stages`, one after the other, in one process group."""
    for stage in _checks.items("zero_stages_worker: stages", stages):  # all, before the first
        worker_args.zero_stage("zero_stages_worker", stage)
    return [zero_worker(rank, world, work, stage, add_grad) for stage in stages]


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
