"""Expert parallelism from scratch: a mixture-of-experts feed-forward layer on one device (`MoE`),
then the same layer with its experts spread over the ranks (`ExpertParallelMoE`), the tokens
travelling to their experts and back with two all-to-alls. Shown in lesson 13.

Routing, the same in both: the router's softmax over all experts, then the top k (1 or 2). A
token's gate for a chosen expert is that expert's probability, renormalised over the k chosen
ones when k = 2 (GShard); with k = 1 it is the probability itself (Switch), so the main loss
still reaches the router. Capacity: an expert takes at most
ceil(capacity_factor * tokens * k / num_experts) of its assignments, first come first served in
(token index, choice) order; an assignment over capacity is dropped, i.e. adds zero. The
load-balancing loss is num_experts * sum_e f_e * P_e, with f_e the fraction of assignments routed
to expert e (before capacity) and P_e the router's mean probability for e.

Across ranks, each rank routes its own tokens against a capacity counted on its own tokens, as
real systems do: with nothing dropped the ranks together equal one device on all tokens; with
drops, each rank equals one device on its slice. One step: an all-to-all of counts (rows per
expert), the dispatch all-to-all, the local experts, the combine all-to-all back, the gates.

The job these layers train, its one-device reference and the worker are in moe_worker.py.
The collectives are written to NCCL's rules (contiguous tensors on the rank's device, split
sizes as Python lists), but only gloo ran them here: `all_to_all_single` with uneven splits.
"""

from __future__ import annotations

import copy
import math
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from .. import _checks
from .._typed import wrap_public


class Routing(NamedTuple):
    """Where N tokens go: per token `probs` (N, E); per assignment, in (token, choice) order,
    `tokens`, `experts`, `gates` and `keep` (within capacity), each of N * k entries."""

    probs: torch.Tensor
    tokens: torch.Tensor
    experts: torch.Tensor
    gates: torch.Tensor
    keep: torch.Tensor


def check_moe(
    caller: str, d_model: int, ffn: int, num_experts: int, top_k: int, capacity_factor: float
) -> None:
    """Refuse sizes below 1, a top_k other than 1 or 2 or above num_experts, a capacity <= 0."""
    for name, value in (("d_model", d_model), ("ffn", ffn), ("num_experts", num_experts)):
        _checks.whole(f"{caller}: {name}", value)
    _checks.whole(f"{caller}: top_k", top_k, most=2)
    if top_k > num_experts:
        raise ValueError(
            f"{caller}: top_k={top_k} chooses more experts than the {num_experts} there are; "
            "give top_k <= num_experts"
        )
    _checks.number(f"{caller}: capacity_factor", capacity_factor, positive=True)


def _expert(d_model: int, ffn: int) -> nn.Sequential:
    """One expert: Linear(d_model, ffn), GELU, Linear(ffn, d_model)."""
    return nn.Sequential(nn.Linear(d_model, ffn), nn.GELU(), nn.Linear(ffn, d_model))


def _route(router: nn.Linear, x: torch.Tensor, top_k: int, capacity: int) -> Routing:
    """Route flat tokens x (N, d): top-k of the router's softmax, gates, who fits in capacity."""
    probs = F.softmax(router(x), dim=-1)
    top_p, top_e = probs.topk(top_k, dim=-1)
    gates = top_p / top_p.sum(-1, keepdim=True) if top_k > 1 else top_p
    experts = top_e.reshape(-1)
    tokens = torch.arange(len(x), device=x.device).repeat_interleave(top_k)
    # an assignment's place in its expert's queue: the assignments to that expert before it
    place = F.one_hot(experts, probs.shape[-1]).cumsum(0).gather(1, experts[:, None]) - 1
    return Routing(probs, tokens, experts, gates.reshape(-1), place.squeeze(1) < capacity)


class MoE(nn.Module):
    """A mixture-of-experts feed-forward layer on one device, for inputs (..., d_model).

    `forward` returns the output; it leaves `aux_loss` (the load-balancing loss, a tensor with
    its graph) and `dropped` (assignments over capacity, an int) on the module.
    """

    def __init__(
        self,
        d_model: int,
        ffn: int,
        num_experts: int,
        top_k: int = 1,
        capacity_factor: float = 1.25,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        check_moe("MoE", d_model, ffn, num_experts, top_k, capacity_factor)
        self.d_model, self.num_experts = d_model, num_experts
        self.top_k, self.capacity_factor = top_k, capacity_factor
        torch.manual_seed(seed)
        self.router = nn.Linear(d_model, num_experts, bias=False)
        self.experts = nn.ModuleList(_expert(d_model, ffn) for _ in range(num_experts))
        self.to(dtype)
        self.aux_loss: torch.Tensor | None = None
        self.dropped = 0

    def capacity(self, tokens: int) -> int:
        """The most assignments one expert takes out of `tokens` tokens."""
        return math.ceil(self.capacity_factor * tokens * self.top_k / self.num_experts)

    def route(self, x: torch.Tensor) -> Routing:
        """The routing of flat tokens x (N, d_model): top-k experts, gates, and who fits."""
        return _route(self.router, x, self.top_k, self.capacity(len(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.d_model)
        r = self.route(flat)
        y = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):  # every expert runs, on no tokens if need be
            mine = (r.keep & (r.experts == e)).nonzero().squeeze(1)
            out = expert(flat[r.tokens[mine]])
            y = y.index_add(0, r.tokens[mine], r.gates[mine, None] * out)
        f = torch.bincount(r.experts, minlength=self.num_experts) / len(r.experts)
        self.aux_loss = self.num_experts * (f * r.probs.mean(0)).sum()
        self.dropped = int((~r.keep).sum())
        return y.reshape(x.shape)


def _all_to_all(x, out_splits, in_splits, traffic: dict, key: str) -> torch.Tensor:
    """Rows in_splits[j] of x go to rank j; rows out_splits[j] come from it. Counts the bytes
    this rank passes to other ranks under traffic[key]."""
    x = x.contiguous()
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x, out_splits, in_splits)
    row = x[0].numel() * x.element_size() if len(x) else 0
    sent = (sum(in_splits) - in_splits[dist.get_rank()]) * row
    traffic[key] = traffic.get(key, 0) + sent
    return out


class _AllToAll(torch.autograd.Function):
    """Forward: send rows to their ranks. Backward: the reverse all-to-all of the gradients."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, traffic, key):
        ctx.splits, ctx.traffic, ctx.key = (out_splits, in_splits), traffic, key
        return _all_to_all(x, out_splits, in_splits, traffic, key)

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = _all_to_all(grad, in_splits, out_splits, ctx.traffic, f"{ctx.key}_backward")
        return back, None, None, None, None


class ExpertParallelMoE(nn.Module):
    """`moe` on rank `rank` of `world`: the router replicated, experts rank*E/world onwards here.

    Each rank routes its own tokens. `forward` leaves on the module `dropped` (this rank's
    assignments over this rank's capacity), `aux_loss` (this rank's share: the shares of all
    ranks add up to the loss of one device on all tokens) and `traffic` (bytes sent to other
    ranks by each all-to-all, forward and backward, adding up until cleared).
    """

    def __init__(self, moe: MoE, rank: int, world: int):
        super().__init__()
        if not isinstance(moe, MoE):
            raise TypeError(f"ExpertParallelMoE: moe must be a d2l MoE, got {type(moe).__name__}")
        _checks.ranks("ExpertParallelMoE", rank, world)
        experts_divide("ExpertParallelMoE", moe.num_experts, world)
        self.rank, self.world, self.local = rank, world, moe.num_experts // world
        self.d_model, self.num_experts = moe.d_model, moe.num_experts
        self.top_k, self.capacity_factor = moe.top_k, moe.capacity_factor
        self.router = copy.deepcopy(moe.router)
        mine = moe.experts[rank * self.local : (rank + 1) * self.local]
        self.experts = copy.deepcopy(mine)
        self.aux_loss: torch.Tensor | None = None
        self.dropped = 0
        self.traffic: dict[str, int] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.d_model)
        capacity = math.ceil(self.capacity_factor * len(flat) * self.top_k / self.num_experts)
        r = _route(self.router, flat, self.top_k, capacity)
        kept = r.keep.nonzero().squeeze(1)
        order = kept[torch.argsort(r.experts[kept], stable=True)]  # by expert, so by owner
        per_expert = torch.bincount(r.experts[order], minlength=self.num_experts)
        # 1. counts: how many rows each rank sends to each of my experts
        got = _all_to_all(
            per_expert, [self.local] * self.world, [self.local] * self.world, self.traffic, "counts"
        ).view(self.world, self.local)
        send_splits = per_expert.view(self.world, self.local).sum(1).tolist()
        recv_splits = got.sum(1).tolist()
        # 2. dispatch, 3. experts, 4. combine (the way back), 5. gates
        recv = _AllToAll.apply(
            flat[r.tokens[order]], recv_splits, send_splits, self.traffic, "dispatch"
        )
        done = self.run_experts(recv, got)
        back = _AllToAll.apply(done, send_splits, recv_splits, self.traffic, "combine")
        y = self.combine(back, r.tokens[order], r.gates[order], len(flat))
        self.aux_loss = self._aux_share(r)
        self.dropped = int((~r.keep).sum())
        return y.reshape(x.shape)

    def run_experts(self, recv: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
        """Each local expert on its rows of `recv` (sources in rank order, experts within)."""
        which = torch.arange(self.local, device=recv.device).repeat(self.world)
        which = which.repeat_interleave(got.flatten())
        out = torch.zeros_like(recv)
        for e, expert in enumerate(self.experts):  # every expert runs, on no rows if need be
            rows = (which == e).nonzero().squeeze(1)
            out = out.index_copy(0, rows, expert(recv[rows]))
        return out

    def combine(
        self, back: torch.Tensor, tokens: torch.Tensor, gates: torch.Tensor, n: int
    ) -> torch.Tensor:
        """Each token's sum of its experts' results (rows of `back`) times their gates."""
        return back.new_zeros((n, self.d_model)).index_add(0, tokens, gates[:, None] * back)

    def _aux_share(self, r: Routing) -> torch.Tensor:
        """This rank's share of the load-balancing loss over the tokens of all ranks: the
        fractions f_e are counted over all ranks (an all-reduce of counts, no gradient)."""
        counts = torch.bincount(r.experts, minlength=self.num_experts)
        counts = torch.cat([counts, counts.new_tensor([len(r.probs)])])
        dist.all_reduce(counts)
        f = counts[:-1] / (counts[-1] * self.top_k)
        return self.num_experts * (f * r.probs.sum(0)).sum() / counts[-1]


def experts_divide(caller: str, num_experts: int, world: int) -> None:
    """Refuse a number of experts that the ranks cannot share evenly."""
    if num_experts % world:
        raise ValueError(
            f"{caller}: num_experts={num_experts} does not split evenly over {world} ranks; "
            "give a multiple of the number of ranks"
        )


def all_to_all_bytes(sent: torch.Tensor, d_model: int, element_size: int) -> dict[str, list]:
    """Bytes each rank sends to other ranks in each all-to-all of one step, predicted from
    `sent[i][j]`, the token rows rank i routes to rank j's experts (a world x world matrix)."""
    sent = torch.as_tensor(sent)
    if sent.dim() != 2 or sent.shape[0] != sent.shape[1]:
        raise ValueError(f"all_to_all_bytes: sent must be a square matrix, got {sent.shape}")
    others = sent - torch.diag(torch.diag(sent))  # rows a rank keeps are not sent
    row = _checks.whole("all_to_all_bytes: d_model", d_model) * _checks.whole(
        "all_to_all_bytes: element_size", element_size
    )
    out, back = (others.sum(1) * row).tolist(), (others.sum(0) * row).tolist()
    return {"dispatch": out, "combine": back, "combine_backward": out, "dispatch_backward": back}


def sent_matrix(moe: MoE, x: torch.Tensor, world: int) -> torch.Tensor:
    """`sent[i][j]` for all_to_all_bytes: the rows that rank i, holding the i-th slice of the
    tokens x (N, d_model), sends to the experts of rank j, routed with `moe`'s router."""
    _checks.whole("sent_matrix: world", world)
    experts_divide("sent_matrix", moe.num_experts, world)
    with torch.no_grad():
        rows = []
        for part in x.reshape(-1, moe.d_model).chunk(world):
            r = moe.route(part)
            owner = r.experts[r.keep] // (moe.num_experts // world)
            rows.append(torch.bincount(owner, minlength=world))
    return torch.stack(rows)


def gather_experts(ep: ExpertParallelMoE, grads: bool = False) -> dict[str, torch.Tensor]:
    """The whole layer's parameters (or gradients), named as in MoE's state_dict, on every rank:
    the router as it is here, each expert all-gathered from its owner."""
    _checks.in_group("gather_experts")
    pick = (lambda p: p.grad) if grads else (lambda p: p)
    out = {"router.weight": pick(ep.router.weight).detach().cpu().clone()}
    names = [name for name, _ in ep.experts[0].named_parameters()]
    parts = {}  # (local expert, name) -> that tensor of every rank, in rank order
    for j, expert in enumerate(ep.experts):
        for name, p in expert.named_parameters():
            parts[j, name] = [torch.empty_like(p) for _ in range(ep.world)]
            dist.all_gather(parts[j, name], pick(p).detach().contiguous())
    for e in range(ep.num_experts):  # expert e is local expert e % local of rank e // local
        for name in names:
            out[f"experts.{e}.{name}"] = parts[e % ep.local, name][e // ep.local].cpu()
    return out


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
