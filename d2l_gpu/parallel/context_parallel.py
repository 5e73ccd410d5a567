"""Context parallelism: the sequence laid out over ranks, and ring attention over it. Shown in
lesson 14.

Each rank holds a part of the sequence. "contiguous" gives rank r the r-th of `world` equal
pieces; "zigzag" cuts the sequence in 2*world chunks and gives rank r chunks r and
2*world-1-r. Under a causal mask a query attends only to earlier keys, so with the contiguous
layout the last rank computes the most score blocks and the first the fewest; with the zig-zag
layout every rank computes the same number (`causal_work` counts them).

**Ring attention.** Attention needs every earlier key, so the key/value blocks travel around a
ring: at step t a rank computes with the block that started on rank r - t while it already sends
that block on to r + 1 and receives the next one from r - 1 (both posted at once with
`batch_isend_irecv`, before the compute, so that a GPU can overlap the two). After world steps
every rank has seen every block, and no rank ever held the whole sequence.

The softmax of a row spans all blocks, so each block's partial result is kept with the
log-sum-exp of its scores, and two partial results merge exactly: with L = log(e^L1 + e^L2),
out = e^(L1 - L) out1 + e^(L2 - L) out2. The causal mask is built from *global* positions: a
chunk of keys wholly in the future of a chunk of queries is skipped, the diagonal chunk pair is
masked inside. With the contiguous layout the last rank computes the most chunk pairs; with
zig-zag every rank computes the same number (ring_attention's `counter` gets one item per product
actually done; `causal_work` predicts them). Backward runs the ring again: it recomputes each
block's probabilities from the saved log-sum-exp and sends each block's key/value gradients
along with the block; one more hop brings them home. This code ran only on gloo (CPU
processes); its messages follow NCCL's rules (contiguous buffers, sends and receives posted
together). PyTorch's own `torch.distributed.tensor.experimental.context_parallel` does the same
ring inside CUDA's scaled-dot-product attention kernels (flash, memory-efficient), with its own
ways of rotating the blocks; it needs CUDA.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.distributed as dist

from .. import _checks
from .._checks import one_of, whole
from .._typed import wrap_public

LAYOUTS = ("contiguous", "zigzag")


def _chunks(rank: int, world: int, layout: str) -> list[int]:
    """Chunk indices (of 2*world equal chunks) that `rank` holds under `layout`, in order."""
    if layout == "zigzag":
        return [rank, 2 * world - 1 - rank]
    return [2 * rank, 2 * rank + 1]


def _check(world: int, layout: str, length: int | None = None) -> None:
    """Refuse a bad world size, layout name or a length that 2*world does not divide."""
    whole("world", world)
    one_of("layout", layout, LAYOUTS)
    if length is not None and length % (2 * world):
        raise ValueError(
            f"sequence length {length} must be divisible by 2*world = {2 * world}; pad or cut it"
        )


def shard_sequence(
    x: torch.Tensor, rank: int, world: int, layout: str = "zigzag", dim: int = -1
) -> torch.Tensor:
    """The part of `x` along `dim` that `rank` holds under `layout`."""
    _check(world, layout, x.shape[dim])
    whole("rank", rank, least=0, most=world - 1)
    pieces = x.chunk(2 * world, dim=dim)
    return torch.cat([pieces[c] for c in _chunks(rank, world, layout)], dim=dim)


def unshard_sequence(
    parts: list[torch.Tensor], world: int, layout: str = "zigzag", dim: int = -1
) -> torch.Tensor:
    """The whole sequence back from every rank's part (the inverse of shard_sequence)."""
    _check(world, layout)
    if len(parts) != world:
        raise ValueError(f"parts must hold one tensor per rank ({world}), got {len(parts)}")
    chunks: list[torch.Tensor | None] = [None] * (2 * world)
    for rank, part in enumerate(parts):
        for c, piece in zip(_chunks(rank, world, layout), part.chunk(2, dim=dim), strict=True):
            chunks[c] = piece
    return torch.cat(cast(list[torch.Tensor], chunks), dim=dim)  # every chunk is filled


def causal_work(world: int, layout: str = "zigzag") -> list[int]:
    """Causal score blocks (chunk x chunk, the diagonal counts 1) each rank computes."""
    _check(world, layout)
    counts = []
    for rank in range(world):
        mine = _chunks(rank, world, layout)
        counts.append(sum(1 for q in mine for k in range(2 * world) if k <= q))
    return counts


def _pass_on(t: torch.Tensor) -> tuple[torch.Tensor, list]:
    """Post: send `t` to the next rank, receive the previous rank's into a new buffer."""
    rank, world = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty_like(t)
    ops = [
        dist.P2POp(dist.isend, t, (rank + 1) % world),
        dist.P2POp(dist.irecv, incoming, (rank - 1) % world),
    ]
    return incoming, dist.batch_isend_irecv(ops)


def _wait(works: list) -> None:
    for w in works:
        w.wait()


def merge(
    out: torch.Tensor, lse: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two partial attention results of the same queries merged exactly (log-sum-exp)."""
    if out.shape != out_b.shape or lse.shape != out.shape[:-1] or lse_b.shape != lse.shape:
        raise ValueError(
            f"merge: out and out_b must have one shape, lse and lse_b that shape without its last "
            f"dimension; got {tuple(out.shape)}, {tuple(lse.shape)}, {tuple(out_b.shape)}, "
            f"{tuple(lse_b.shape)}"
        )
    new = torch.logaddexp(lse, lse_b)
    return out * torch.exp(lse - new)[..., None] + out_b * torch.exp(lse_b - new)[..., None], new


def _scores(q, k, diagonal: bool, scale: float) -> torch.Tensor:
    """q k^T * scale, with the causal mask inside a diagonal chunk pair."""
    s = q @ k.transpose(-2, -1) * scale
    if diagonal:
        n = q.shape[-2]
        future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(future, float("-inf"))
    return s


def _pairs(rank: int, src: int, world: int, layout: str):
    """(my chunk slot, src's chunk slot, diagonal) for each chunk pair not wholly in the future."""
    mine, theirs = _chunks(rank, world, layout), _chunks(src, world, layout)
    return [
        (i, j, qc == kc) for i, qc in enumerate(mine) for j, kc in enumerate(theirs) if kc <= qc
    ]


class _RingAttention(torch.autograd.Function):
    """Forward and backward of causal attention, the key/value blocks passed around a ring."""

    @staticmethod
    def forward(ctx, q, k, v, layout, counter):
        rank, world = dist.get_rank(), dist.get_world_size()
        scale = 1 / math.sqrt(q.shape[-1])
        qs = q.chunk(2, dim=-2)
        outs, lses = [None, None], [None, None]
        kv = torch.stack([k, v]).contiguous()
        for t in range(world):
            src = (rank - t) % world
            if t < world - 1:
                incoming, works = _pass_on(kv)  # posted before the compute: overlap on a GPU
            ks, vs = kv[0].chunk(2, dim=-2), kv[1].chunk(2, dim=-2)
            for i, j, diagonal in _pairs(rank, src, world, layout):
                s = _scores(qs[i], ks[j], diagonal, scale)
                lse_b = torch.logsumexp(s, dim=-1)
                out_b = torch.exp(s - lse_b[..., None]) @ vs[j]
                if outs[i] is None:
                    outs[i], lses[i] = out_b, lse_b
                else:
                    outs[i], lses[i] = merge(outs[i], lses[i], out_b, lse_b)
                counter.append(1)
            if t < world - 1:
                _wait(works)
                kv = incoming
        out, lse = torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout = layout
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        rank, world = dist.get_rank(), dist.get_world_size()
        scale = 1 / math.sqrt(q.shape[-1])
        delta = (dout * out).sum(-1)  # the softmax's backward needs sum_j p_ij dp_ij = dout . out
        qs, dos = q.chunk(2, dim=-2), dout.contiguous().chunk(2, dim=-2)
        lses, deltas = lse.chunk(2, dim=-1), delta.chunk(2, dim=-1)
        dq = torch.zeros_like(q)
        dqs = dq.chunk(2, dim=-2)
        # k, v and their gradients travel together: [k, v, dk, dv]
        block = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)]).contiguous()
        for t in range(world):
            src = (rank - t) % world
            ks, vs = block[0].chunk(2, dim=-2), block[1].chunk(2, dim=-2)
            dks, dvs = block[2].chunk(2, dim=-2), block[3].chunk(2, dim=-2)
            for i, j, diagonal in _pairs(rank, src, world, ctx.layout):
                p = torch.exp(_scores(qs[i], ks[j], diagonal, scale) - lses[i][..., None])
                dvs[j].add_(p.transpose(-2, -1) @ dos[i])
                ds = p * (dos[i] @ vs[j].transpose(-2, -1) - deltas[i][..., None]) * scale
                dqs[i].add_(ds @ ks[j])
                dks[j].add_(ds.transpose(-2, -1) @ qs[i])
            if t < world - 1:  # the block and its gradients so far, on to the next rank
                block, works = _pass_on(block)
                _wait(works)
        if world == 1:
            return dq, block[2], block[3], None, None
        home, works = _pass_on(block[2:].contiguous())  # one more hop: the gradients go home
        _wait(works)
        return dq, home[0], home[1], None, None


def ring_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: str = "zigzag", counter=None
) -> torch.Tensor:
    """Causal attention of this rank's part [B, H, T/world, Dh] of q, k, v over the whole
    sequence, inside a process group; `counter` (a list) gets one item per chunk pair computed."""
    _checks.in_group("ring_attention")
    _checks.one_of("ring_attention: layout", layout, LAYOUTS)
    if not (q.shape == k.shape == v.shape) or q.dim() != 4:
        raise ValueError(
            "ring_attention needs q, k and v of one shape [batch, heads, part, head_dim], got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[-2] % 2:
        raise ValueError(
            f"ring_attention: this rank's part has {q.shape[-2]} tokens; it must be two equal "
            "chunks (shard a sequence whose length 2*world divides with shard_sequence)"
        )
    return _RingAttention.apply(q, k, v, layout, [] if counter is None else counter)


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
