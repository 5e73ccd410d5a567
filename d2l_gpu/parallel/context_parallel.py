"""How context parallelism lays a sequence over ranks, and the causal attention work per rank.

Each rank holds a part of the sequence. "contiguous" gives rank r the r-th of `world` equal
pieces; "zigzag" cuts the sequence in 2*world chunks and gives rank r chunks r and
2*world-1-r. Under a causal mask a query attends only to earlier keys, so with the contiguous
layout the last rank computes the most score blocks and the first the fewest; with the zig-zag
layout every rank computes the same number (`causal_work` counts them).
"""

from __future__ import annotations

import torch

from .._checks import one_of, whole

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
    return torch.cat(chunks, dim=dim)


def causal_work(world: int, layout: str = "zigzag") -> list[int]:
    """Causal score blocks (chunk x chunk, the diagonal counts 1) each rank computes."""
    _check(world, layout)
    counts = []
    for rank in range(world):
        mine = _chunks(rank, world, layout)
        counts.append(sum(1 for q in mine for k in range(2 * world) if k <= q))
    return counts
