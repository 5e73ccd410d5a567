"""The context-parallel job: the small transformer trained with every sequence split over the
ranks (ring attention in every block), and what one step sends, measured and predicted. Shown in
lesson 14.

Each rank holds its part of the tokens and of their targets, and the whole model. Everything but
attention acts token by token, so only attention talks: per block, forward passes world - 1 key/
value blocks around the ring; backward passes world - 1 blocks with their gradients (twice the
size) and one more hop of gradients home. The loss of a rank is the mean over its own tokens;
every rank holds the same number of tokens, so the mean over ranks of the parameters' gradients
(one all-reduce) is the gradient of the whole sequence's mean loss, as on one device.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.distributed as dist
from torch import nn

from .. import _checks
from .._typed import wrap_public
from ..distributed import all_reduce_together, rank_device
from ..gpt import TransformerBlock
from .context_parallel import LAYOUTS, _check, ring_attention, shard_sequence
from .footprint import CollectiveCounter
from .workload import TransformerWorkload, train_transformer


class RingAttentionBlock(TransformerBlock):
    """`block` (its layers, shared) with ring attention over this rank's part of the sequence."""

    def __init__(self, block: TransformerBlock, layout: str, counter: list | None = None):
        nn.Module.__init__(self)  # the layers are block's own: nothing new to build
        self.num_heads = block.num_heads
        self.ln1, self.ln2, self.qkv, self.proj = block.ln1, block.ln2, block.qkv, block.proj
        self.fc1, self.fc2 = block.fc1, block.fc2
        self.layout, self.counter = layout, counter

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return ring_attention(q, k, v, self.layout, self.counter)


def context_parallel_transformer(net: nn.Sequential, layout: str, counter=None) -> nn.Sequential:
    """`net` (d2l.transformer) with ring attention in every block; the parameters are net's."""
    _checks.module("context_parallel_transformer: net", net, sequential=True)
    _checks.one_of("context_parallel_transformer: layout", layout, LAYOUTS)
    return nn.Sequential(
        *(RingAttentionBlock(u, layout, counter) if isinstance(u, TransformerBlock) else u
          for u in net)
    )  # fmt: skip


def ring_bytes(work: TransformerWorkload, world: int) -> dict[str, int]:
    """Predicted bytes one rank sends in one training step, point to point (ring) and in the
    gradients' all-reduce (the whole flat gradient, as CollectiveCounter counts it)."""
    item = torch.finfo(work.dtype).bits // 8
    block = work.batch_size * (work.seq_len // world) * work.d_model * item  # k or v, one part
    per_layer = (world - 1) * 2 * block + (world - 1) * 4 * block + 2 * block if world > 1 else 0
    params = sum(p.numel() for p in work.model().parameters()) * item
    return {"send": per_layer * work.num_layers, "all_reduce": params}


def _mean_grads(net: nn.Module) -> None:
    """Every parameter's gradient replaced by its mean over the ranks (one flat all-reduce)."""
    all_reduce_together([cast(torch.Tensor, p.grad) for p in net.parameters()], mean=True)


def context_parallel_worker(
    rank: int, world: int, work: TransformerWorkload, layout: str = "zigzag"
) -> dict:
    """Train with every sequence split over the ranks; compare with one device.

    Returns the losses of the whole batch, the parameters after training, one step's messages
    (calls and bytes, as the dispatcher saw them), the predicted bytes, and the chunk pairs of
    attention this rank computed in one forward pass of one block.
    """
    _checks.ranks("context_parallel_worker", rank, world)
    if not isinstance(work, TransformerWorkload):
        kind = type(work).__name__
        raise TypeError(f"context_parallel_worker: work must be a TransformerWorkload, got {kind}")
    _check(world, layout, work.seq_len)
    _checks.in_group("context_parallel_worker", rank, world)
    device = rank_device()
    X, y = (shard_sequence(t, rank, world, layout, dim=1).to(device) for t in work.data())
    counter: list = []
    net = context_parallel_transformer(work.model().to(device), layout, counter)
    with CollectiveCounter() as messages:  # the first step: what one step sends
        losses = train_transformer(net, X, y, 1, work.lr, _mean_grads)
    losses += train_transformer(net, X, y, work.steps - 1, work.lr, _mean_grads)
    mean = torch.tensor(losses, dtype=torch.float64, device=device)
    dist.all_reduce(mean)  # every rank's mean over the same number of tokens
    counter.clear()
    with torch.no_grad():
        net(X)
    return {
        "losses": (mean / world).tolist(),
        "params": [p.detach().cpu() for p in net.parameters()],
        "calls": messages.calls,
        "bytes": messages.bytes,
        "predicted": ring_bytes(work, world),
        "pairs": len(counter) // work.num_layers,
    }


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
