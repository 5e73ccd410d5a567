"""The expert-parallel job: `MoEWorkload` (one MoE layer regressing random targets), its
one-device reference `train_moe_one_device`, and `expert_parallel_worker`, which trains the layer
with its experts spread over the ranks (the layers are in expert_parallel.py).

Each rank takes its slice of the tokens. Every loss is divided by the global number of tokens,
so the ranks' losses add up to the one-device loss; the replicated router's gradients are summed
over the ranks, an expert's arrive at its owner through the all-to-alls' backward. Only gloo ran
these workers here. Shown in lesson 13.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .. import _checks
from .._typed import wrap_public
from ..distributed import rank_device
from .expert_parallel import (
    ExpertParallelMoE,
    MoE,
    all_to_all_bytes,
    check_moe,
    experts_divide,
    gather_experts,
    sent_matrix,
)
from .footprint import CollectiveCounter


@dataclass(frozen=True, kw_only=True)
class MoEWorkload:
    """The job `expert_parallel_worker` trains: one MoE layer regressing random targets,
    loss = mean squared error + aux_weight * load-balancing loss, plain SGD on all tokens."""

    d_model: int = 8
    ffn: int = 16
    num_experts: int = 4
    top_k: int = 1
    capacity_factor: float = 4.0
    tokens: int = 32
    steps: int = 3
    lr: float = 0.1
    dtype: torch.dtype = torch.float64
    seed: int = 0
    aux_weight: float = 0.01

    def __post_init__(self):
        c = "MoEWorkload"
        check_moe(c, self.d_model, self.ffn, self.num_experts, self.top_k, self.capacity_factor)
        _checks.whole(f"{c}: tokens", self.tokens)
        _checks.number(f"{c}: aux_weight", self.aux_weight)
        _checks.job(c, self)

    def model(self) -> MoE:
        """The layer every rank starts from, seeded."""
        args = (self.d_model, self.ffn, self.num_experts, self.top_k, self.capacity_factor)
        return MoE(*args, seed=self.seed, dtype=self.dtype)

    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All tokens (1, tokens, d_model) and their targets, the same on every rank."""
        g = torch.Generator().manual_seed(self.seed + 1)
        shape = (1, self.tokens, self.d_model)
        return torch.randn(shape, generator=g, dtype=self.dtype), torch.randn(
            shape, generator=g, dtype=self.dtype
        )


def _train(layer, x, target, work: MoEWorkload, sync, record, watch=None) -> list[float]:
    """SGD steps on `layer`; loss over all tokens (this rank's share); `sync` after backward,
    `record(step, y)` before the update; the first step's collectives inside `watch`."""
    losses = []
    for step in range(work.steps):
        layer.zero_grad()
        x.grad = None
        with watch if watch is not None and step == 0 else contextlib.nullcontext():
            y = layer(x)
            err = ((y - target) ** 2).sum() / (work.tokens * work.d_model)
            loss = err + work.aux_weight * layer.aux_loss
            loss.backward()
            sync()
        record(step, y)
        with torch.no_grad():
            for p in layer.parameters():
                p -= work.lr * p.grad
        losses.append(loss.item())
    return losses


def train_moe_one_device(work: MoEWorkload) -> dict:
    """The reference: the whole layer and all tokens on one device. Returns the losses, the
    final parameters, and the first step's output, input gradient, gradients and drops."""
    if not isinstance(work, MoEWorkload):
        raise TypeError(f"train_moe_one_device: work must be a MoEWorkload, got {work!r}")
    moe, (x, target) = work.model(), work.data()
    x.requires_grad_(True)
    first: dict[str, Any] = {}

    def record(step, y):
        if step == 0:
            grads = {n: p.grad.clone() for n, p in moe.named_parameters()}
            first.update(output=y.detach().clone(), input_grad=x.grad.clone(), grads=grads)
            first.update(dropped=moe.dropped, aux=moe.aux_loss.item())

    losses = _train(moe, x, target, work, lambda: None, record)
    params = {n: p.detach().clone() for n, p in moe.named_parameters()}
    return {"losses": losses, "params": params, "first": first}


def expert_parallel_worker(rank: int, world: int, work: MoEWorkload) -> dict:
    """Train the layer with its experts spread over the ranks, each rank on its slice of the
    tokens; the router's gradients are summed over the ranks, the experts' stay with their owner.

    Returns this rank's losses (shares: they add up over ranks), the whole final parameters,
    the first step's output and input gradient (this rank's tokens), whole gradients, drops,
    aux share, the bytes each all-to-all sent to other ranks (measured in `first["traffic"]`,
    predicted from the routing in `predicted`, with the routing's matrix `sent`) and what
    CollectiveCounter saw (`first["calls"]`, `first["bytes"]`: for an all-to-all, the bytes
    received, this rank's own rows included).
    """
    _checks.ranks("expert_parallel_worker", rank, world)
    if not isinstance(work, MoEWorkload):
        raise TypeError(f"expert_parallel_worker: work must be a MoEWorkload, got {work!r}")
    experts_divide("expert_parallel_worker", work.num_experts, world)
    if work.tokens % world:
        raise ValueError(
            f"expert_parallel_worker: tokens={work.tokens} do not split evenly over {world} "
            "ranks; give a multiple of the number of ranks"
        )
    _checks.in_group("expert_parallel_worker", rank, world)
    device, moe, (X, Y) = rank_device(), work.model(), work.data()
    x, target = (t.chunk(world, dim=1)[rank].to(device) for t in (X, Y))
    size = torch.finfo(work.dtype).bits // 8
    sent = sent_matrix(moe, X, world)
    predicted = all_to_all_bytes(sent, work.d_model, size)
    ep = ExpertParallelMoE(moe.to(device), rank, world)
    x.requires_grad_(True)
    first: dict[str, Any] = {}

    def sync():  # the replicated router: sum its gradients (the losses are shares already)
        for p in ep.router.parameters():
            dist.all_reduce(p.grad)

    def record(step, y):
        if step == 0:
            first.update(output=y.detach().cpu(), input_grad=x.grad.cpu(), dropped=ep.dropped)
            first.update(grads=gather_experts(ep, grads=True), aux=ep.aux_loss.item())
            first.update(traffic=dict(ep.traffic))

    counter = CollectiveCounter()  # sees each collective's tensors: a second, independent count
    losses = _train(ep, x, target, work, sync, record, counter)
    first.update(calls=counter.calls, bytes=counter.bytes)
    mine = {key: value[rank] for key, value in predicted.items()}
    out = {"losses": losses, "params": gather_experts(ep), "first": first, "predicted": mine}
    return {**out, "sent": sent}


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
