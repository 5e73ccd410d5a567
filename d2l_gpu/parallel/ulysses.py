"""Ulysses-style context parallelism (DeepSpeed-Ulysses): the sequence split over the ranks, and
attention computed by heads after an all-to-all. Shown in lesson 14.

Each rank holds a contiguous part of every sequence, as with ring attention. Before attention,
one all-to-all trades parts of the sequence for groups of heads: rank r sends head group j of its
part to rank j and receives from every rank its part of head group r. Now rank r holds the whole
sequence for H/world heads and computes ordinary causal attention on them, with nothing more to
send. A second all-to-all, the inverse, gives every rank back its part of the sequence for all
heads. Backward runs the two all-to-alls in reverse. The heads must divide over the ranks; each
rank sends 2 x (world - 1) / world of its q, k, v and output per block and direction, whatever
the sequence length, where the ring sends world - 1 key/value blocks. This code ran only on gloo
(CPU processes); its all-to-alls follow NCCL's rules (contiguous buffers, equal splits).
"""

from __future__ import annotations

from typing import cast

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from .. import _checks
from .._typed import wrap_public
from ..distributed import all_reduce_together, rank_device
from ..gpt import TransformerBlock
from .context_parallel import shard_sequence
from .expert_parallel import _AllToAll
from .workload import TransformerWorkload, train_transformer


def _trade(x: torch.Tensor, world: int, traffic: dict, key: str) -> torch.Tensor:
    """Row j of x [world, ...] goes to rank j; row j of the result came from rank j."""
    rows = x.contiguous().view(world, -1)
    return _AllToAll.apply(rows, [1] * world, [1] * world, traffic, key).view(x.shape)


def ulysses_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, traffic: dict | None = None
) -> torch.Tensor:
    """Causal attention of this rank's contiguous part [B, H, T/world, Dh] of q, k, v over the whole
    sequence: heads traded for sequence by an all-to-all, attention, then the inverse all-to-all.
    `traffic` (a dict) gets the bytes this rank sends to other ranks, by all-to-all."""
    _checks.in_group("ulysses_attention")
    world, traffic = dist.get_world_size(), {} if traffic is None else traffic
    if not (q.shape == k.shape == v.shape) or q.dim() != 4:
        raise ValueError(
            "ulysses_attention needs q, k and v of one shape [batch, heads, part, head_dim], got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    B, H, S, Dh = q.shape
    if H % world:
        raise ValueError(
            f"ulysses_attention: {H} heads do not divide over {world} ranks; Ulysses gives each "
            "rank whole heads (use ring attention, or a number of ranks that divides the heads)"
        )
    g = H // world

    def to_heads(t, key):  # [B, H, S, Dh] -> [B, g, world * S, Dh]: my heads, every part
        parts = _trade(t.view(B, world, g, S, Dh).transpose(0, 1), world, traffic, key)
        return parts.permute(1, 2, 0, 3, 4).reshape(B, g, world * S, Dh)

    q, k, v = (to_heads(t, name) for t, name in ((q, "q"), (k, "k"), (v, "v")))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # whole sequence, g heads
    back = _trade(out.view(B, g, world, S, Dh).permute(2, 0, 1, 3, 4), world, traffic, "out")
    return back.transpose(0, 1).reshape(B, H, S, Dh)  # [world, B, g, ...] -> my part, all heads


class UlyssesBlock(TransformerBlock):
    """`block` (its layers, shared) with Ulysses attention over this rank's part of the sequence."""

    def __init__(self, block: TransformerBlock, traffic: dict):
        nn.Module.__init__(self)  # the layers are block's own: nothing new to build
        self.num_heads = block.num_heads
        self.ln1, self.ln2, self.qkv, self.proj = block.ln1, block.ln2, block.qkv, block.proj
        self.fc1, self.fc2 = block.fc1, block.fc2
        self.traffic = traffic

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return ulysses_attention(q, k, v, self.traffic)


def ulysses_worker(rank: int, world: int, work: TransformerWorkload) -> dict:
    """Train with every sequence split over the ranks and Ulysses attention in every block.

    Returns the losses of the whole batch, the parameters after training, and the bytes this rank
    sent in each kind of all-to-all during the first step.
    """
    _checks.ranks("ulysses_worker", rank, world)
    if not isinstance(work, TransformerWorkload):
        kind = type(work).__name__
        raise TypeError(f"ulysses_worker: work must be a TransformerWorkload, got {kind}")
    if work.seq_len % world or work.num_heads % world:
        raise ValueError(
            f"ulysses_worker: {world} ranks must divide the sequence ({work.seq_len} tokens) and "
            f"the heads ({work.num_heads})"
        )
    _checks.in_group("ulysses_worker", rank, world)
    device = rank_device()
    X, y = (shard_sequence(t, rank, world, "contiguous", dim=1).to(device) for t in work.data())
    traffic: dict = {}
    model = work.model().to(device)
    net = nn.Sequential(
        *(UlyssesBlock(u, traffic) if isinstance(u, TransformerBlock) else u for u in model)
    )

    def mean_grads(net: nn.Module) -> None:  # every rank holds as many tokens: the mean is exact
        all_reduce_together([cast(torch.Tensor, p.grad) for p in net.parameters()], mean=True)

    losses = train_transformer(net, X, y, 1, work.lr, mean_grads)
    first = dict(traffic)
    losses += train_transformer(net, X, y, work.steps - 1, work.lr, mean_grads)
    mean = torch.tensor(losses, dtype=torch.float64, device=device)
    dist.all_reduce(mean)
    return {
        "losses": (mean / world).tolist(),
        "params": [p.detach().cpu() for p in net.parameters()],
        "traffic": first,
    }


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
