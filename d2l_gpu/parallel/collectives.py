"""All-reduce from scratch with point-to-point messages: parameter servers, ring, hierarchy.

Shown in lesson 12. Every rank of a process group (started, for example, by `run_workers`) calls
the same function; it sums a tensor over the ranks in `ranks` (all ranks when None) in place,
using only sends and receives between pairs of ranks. Every rank ends with the same bits, and with
the sum `dist.all_reduce` computes (exactly for integers, to rounding for floats).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import _checks
from .._typed import wrap_public
from ..distributed import rank_device


def flat_view(x: torch.Tensor) -> torch.Tensor:
    """`x` as one flat view sharing its memory (the algorithms work on contiguous buffers)."""
    if not x.is_contiguous():
        raise ValueError(
            f"a tensor of shape {tuple(x.shape)} is not contiguous: the collective would "
            "update a copy; pass x.contiguous() (and copy the result back) instead"
        )
    return x.view(-1)


def members(ranks: list[int] | None) -> tuple[list[int], int]:
    """The participating ranks, in order, and this process's position among them."""
    ranks = list(range(dist.get_world_size())) if ranks is None else list(ranks)
    me = dist.get_rank()
    if me not in ranks:
        raise ValueError(f"rank {me} called a collective over ranks {ranks} that excludes it")
    return ranks, ranks.index(me)


_REVERSE: dict = {}  # under gloo: the group whose connections carry messages to lower ranks


def open_reverse_links() -> None:
    """Collective: messages to lower ranks get gloo connections of their own (lesson 12)."""
    # Gloo moves the two directions of one connection one after the other, so two ranks that
    # exchange data at once would get half their link each. A second group opens a second
    # connection between every pair of ranks: one carries messages up, the other down.
    _checks.in_group("open_reverse_links")
    if dist.get_backend() == "gloo" and _REVERSE.get("world") is not dist.group.WORLD:
        _REVERSE.update(world=dist.group.WORLD, group=dist.new_group(backend="gloo"))


def reverse_group() -> dist.ProcessGroup | None:
    """The group of `open_reverse_links` for messages to lower ranks, or None (lesson 12)."""
    return _REVERSE["group"] if _REVERSE.get("world") is dist.group.WORLD else None


def exchange(sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]]) -> None:
    """Post all sends and receives (tensor, global rank) at once, then wait (lesson 12)."""
    # Posting first matters: two ranks that each sent before receiving could wait forever.
    sends = [(t, peer) for t, peer in sends if t.numel() > 0]
    recvs = [(t, peer) for t, peer in recvs if t.numel() > 0]
    me = dist.get_rank()
    down = reverse_group()
    if down is not None:  # gloo with reverse links: up and down apart
        works = [dist.isend(t, peer, group=down if peer < me else None) for t, peer in sends]
        works += [dist.irecv(t, peer, group=down if me < peer else None) for t, peer in recvs]
    else:
        ops = [dist.P2POp(dist.isend, t, peer) for t, peer in sends]
        ops += [dist.P2POp(dist.irecv, t, peer) for t, peer in recvs]
        works = dist.batch_isend_irecv(ops) if ops else []
    for work in works:
        work.wait()


def key_ranges(numel: int, num_servers: int) -> list[tuple[int, int]]:
    """Keys 0..numel-1 as `num_servers` (start, stop) ranges of nearly equal size (lesson 12)."""
    if num_servers < 1:
        raise ValueError(f"num_servers must be at least 1, got {num_servers}")
    bounds = [numel * s // num_servers for s in range(num_servers + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def ps_push_pull(x: torch.Tensor, num_servers: int = 1, ranks: list[int] | None = None) -> None:
    """Sum `x` over `ranks` through parameter servers: push key ranges, pull sums (lesson 12)."""
    # The first num_servers ranks also serve one key range each. One server is the naive
    # scheme of lesson 5 (all traffic on its link); k servers spread it over every rank's link.
    ranks, me = members(ranks)
    if not 1 <= num_servers <= len(ranks):
        raise ValueError(f"num_servers must be between 1 and {len(ranks)}, got {num_servers}")
    flat = flat_view(x)
    parts = [flat[a:b] for a, b in key_ranges(flat.numel(), num_servers)]
    others = [r for i, r in enumerate(ranks) if i != me]
    serving = me < num_servers
    inbox = {r: torch.empty_like(parts[me]) for r in others} if serving else {}
    pushes = [(parts[s], ranks[s]) for s in range(num_servers) if s != me]
    exchange(pushes, [(buf, r) for r, buf in inbox.items()])  # push
    if serving:  # add the pushed slices in rank order, so every run sums alike
        total = torch.zeros_like(parts[me])
        for r in ranks:
            total += parts[me] if r == ranks[me] else inbox[r]
        parts[me].copy_(total)
    pulls = [(parts[s], ranks[s]) for s in range(num_servers) if s != me]
    exchange([(parts[me], r) for r in others] if serving else [], pulls)  # pull


def ring_all_reduce(x: torch.Tensor, ranks: list[int] | None = None) -> None:
    """Sum `x` over `ranks` around a ring: reduce-scatter, then all-gather (lesson 12)."""
    # In step t of the reduce-scatter, position i sends chunk i - t to its right neighbour and
    # adds the chunk i - t - 1 arriving from its left one; after k - 1 steps it holds the whole
    # sum of chunk i + 1, which the all-gather passes on. Each rank sends 2(k-1)/k of x.
    ranks, i = members(ranks)
    k = len(ranks)
    if k == 1:
        return
    chunks = flat_view(x).tensor_split(k)
    right, left = ranks[(i + 1) % k], ranks[(i - 1) % k]
    for t in range(k - 1):  # reduce-scatter
        out, into = chunks[(i - t) % k], chunks[(i - t - 1) % k]
        incoming = torch.empty_like(into)
        exchange([(out, right)], [(incoming, left)])
        into += incoming
    for t in range(k - 1):  # all-gather: pass the finished chunks on
        exchange([(chunks[(i + 1 - t) % k], right)], [(chunks[(i - t) % k], left)])


def hierarchical_all_reduce(
    x: torch.Tensor, local_size: int, ranks: list[int] | None = None
) -> None:
    """Sum `x`: reduce inside each machine, ring across machines, broadcast inside (lesson 12)."""
    # Consecutive blocks of local_size ranks form one machine, led by their first rank. Only
    # the leaders use the (slow) link between machines.
    ranks, me = members(ranks)
    if local_size < 1 or len(ranks) % local_size:
        raise ValueError(
            f"{len(ranks)} ranks cannot form machines of local_size={local_size}: "
            "choose a local_size that divides the number of ranks"
        )
    flat = flat_view(x)
    first = me - me % local_size
    machine = ranks[first : first + local_size]
    leader = machine[0]
    if ranks[me] == leader:
        inbox = [torch.empty_like(flat) for _ in machine[1:]]
        exchange([], list(zip(inbox, machine[1:], strict=True)))  # 1. reduce inside
        for buf in inbox:
            flat += buf
        ring_all_reduce(flat, ranks[::local_size])  # 2. across machines, leaders only
        exchange([(flat, r) for r in machine[1:]], [])  # 3. broadcast inside
    else:
        exchange([(flat, leader)], [])
        exchange([], [(flat, leader)])


def two_level_all_reduce(x: torch.Tensor, local_size: int, ranks: list[int] | None = None) -> None:
    """Sum `x`: reduce-scatter inside, all-reduce each part across, all-gather (lesson 12)."""
    # As Horovod's hierarchical all-reduce does: the rank at position p of its machine sums part p
    # of x over its machine, then over the ranks at position p of every machine (a ring each,
    # all rings at once), then every machine gathers its parts back.
    ranks, me = members(ranks)
    if local_size < 1 or len(ranks) % local_size:
        raise ValueError(
            f"{len(ranks)} ranks cannot form machines of local_size={local_size}: "
            "choose a local_size that divides the number of ranks"
        )
    parts = flat_view(x).tensor_split(local_size)
    first, mine = me - me % local_size, me % local_size
    machine = ranks[first : first + local_size]
    others = [r for r in machine if r != ranks[me]]
    inbox = {r: torch.empty_like(parts[mine]) for r in others}
    sends = [(parts[machine.index(r)], r) for r in others]
    exchange(sends, list(zip(inbox.values(), others, strict=True)))  # 1. reduce-scatter
    total = torch.zeros_like(parts[mine])
    for r in machine:  # in machine order, so every run adds alike
        total += parts[mine] if r == ranks[me] else inbox[r]
    parts[mine].copy_(total)
    ring_all_reduce(parts[mine], ranks[mine::local_size])  # 2. across, position by position
    exchange(  # 3. all-gather inside
        [(parts[mine], r) for r in others], [(parts[machine.index(r)], r) for r in others]
    )


_flat, _members = flat_view, members  # the names of earlier versions

ALGORITHMS = {  # name -> fn(x, ranks, group): the all-reduces that lesson 12 compares
    "all_reduce": lambda x, ranks, group: dist.all_reduce(x, group=group),
    "one server": lambda x, ranks, group: ps_push_pull(x, 1, ranks),
    "k servers": lambda x, ranks, group: ps_push_pull(x, len(ranks), ranks),
    "ring": lambda x, ranks, group: ring_all_reduce(x, ranks),
    "hierarchical": lambda x, ranks, group: hierarchical_all_reduce(x, 2, ranks),
    "two-level": lambda x, ranks, group: two_level_all_reduce(x, 2, ranks),
}


def ring_step(x: torch.Tensor, ranks: list[int] | None = None) -> None:
    """One ring step: send `x` right and receive as much from the left, at once (lesson 12)."""
    # Not an all-reduce: it times the link as a ring loads it, every rank sending at the same time.
    ranks, i = members(ranks)
    k = len(ranks)
    exchange([(x, ranks[(i + 1) % k])], [(torch.empty_like(x), ranks[(i - 1) % k])])


def server_push(x: torch.Tensor, ranks: list[int] | None = None) -> None:
    """One server's push alone: every other rank sends `x` to the first at once (lesson 12)."""
    # Not an all-reduce: it times the first rank's link as one server loads it, k - 1 messages
    # arriving together into fresh buffers. `server_pull` times the way back.
    ranks, i = members(ranks)
    if i == 0:
        exchange([], [(torch.empty_like(x), r) for r in ranks[1:]])
    else:
        exchange([(x, ranks[0])], [])


def server_pull(x: torch.Tensor, ranks: list[int] | None = None) -> None:
    """One server's pull alone: the first rank sends `x` to every other rank at once (lesson 12)."""
    ranks, i = members(ranks)
    if i == 0:
        exchange([(x, r) for r in ranks[1:]], [])
    else:
        exchange([], [(x, ranks[0])])


TIMED = {  # lesson 12: the all-reduces, and single phases that time a link as they load it
    **ALGORITHMS,
    "ring step": lambda x, ranks, group: ring_step(x, ranks),
    "server push": lambda x, ranks, group: server_push(x, ranks),
    "server pull": lambda x, ranks, group: server_pull(x, ranks),
}


def check_worker(rank: int, world_size: int, sizes: tuple = (1, 3, 1000, 1001)) -> list[tuple]:
    """Rows (algorithm, k, ints equal, floats close, same bits) against all_reduce (lesson 12)."""
    # Every algorithm on ranks 0..k-1 for k = 2 .. world_size, with integers and floats of
    # uneven sizes; the flags are combined over the ranks, so every rank returns the same rows.
    _checks.ranks("check_worker", rank, world_size, least=2)
    for n in _checks.items("check_worker: sizes", sizes):
        _checks.whole("check_worker: each of sizes", n, least=0)
    _checks.in_group("check_worker", rank, world_size)
    open_reverse_links()
    dist.barrier()  # under NCCL: every rank sets up its communicator before the first message
    device, rows = rank_device(rank), []
    for k in range(2, world_size + 1):
        ranks, group = list(range(k)), dist.new_group(list(range(k)))
        if rank >= k:
            continue
        for name, fn in ALGORITHMS.items():
            if name == "all_reduce" or (name in ("hierarchical", "two-level") and k % 2):
                continue
            g = torch.Generator().manual_seed(rank)
            ints = [torch.randint(-(10**9), 10**9, (n,), generator=g).to(device) for n in sizes]
            floats = [(torch.randn(n, generator=g) * 10**rank).to(device) for n in sizes]
            mine = [t.clone() for t in ints + floats]
            for t in mine:
                fn(t, ranks, group)
            for t in ints + floats:  # the reference, in place
                dist.all_reduce(t, group=group)
            ints_equal = all(torch.equal(a, b) for a, b in zip(mine, ints, strict=False))
            floats_close = all(
                torch.allclose(a, b, rtol=1e-5, atol=1e-3)
                for a, b in zip(mine[len(ints) :], floats, strict=True)
            )
            same = True
            for part in (torch.cat(mine[: len(ints)]), torch.cat(mine[len(ints) :])):
                everyone = [torch.empty_like(part) for _ in ranks]
                dist.all_gather(everyone, part, group=group)
                same = same and all(torch.equal(e, everyone[0]) for e in everyone)
            flags = torch.tensor([ints_equal, floats_close, same], dtype=torch.int64, device=device)
            dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=group)  # true on every rank
            rows.append((name, k, *(bool(f) for f in flags)))
    return rows


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
