"""A student's own all-reduce on real ranks: checked against `dist.all_reduce`, its messages
counted by direction and by thread, and timed beside the ring.

Shown in lesson 12 (exercise 5: a ring both ways round). The function comes as source text
(`inspect.getsource`), because each rank is a new process that cannot import a notebook's cells.
It may use `torch`, `dist`, `threading`, `collectives` (d2l_gpu.parallel.collectives) and the
lesson's `exchange`, `members` and `flat_view`, and is called as f(x, ranks): sum the tensor x
over `ranks` in place, with `exchange` (which `ring_all_reduce` uses too) carrying its messages.
On GPUs (NCCL) the messages between two ranks must be posted in the same order on both, which
one thread posting each step's messages together guarantees and two threads do not; the result
says how many threads sent.
"""

from __future__ import annotations

import threading
from types import EllipsisType

import torch
import torch.distributed as dist

from .. import _checks
from .._typed import wrap_public
from ..distributed import rank_device
from . import collectives, worker_args
from .costmodel import time_ops


class _Traffic:
    """Stands in for collectives.exchange: counts the bytes sent to each neighbour and the
    threads that send, and holds the first message each way until a message the other way has
    begun (both at once)."""

    def __init__(self, left: int, right: int, wait_s: float):
        self.wait_s = wait_s
        self.sent = {left: 0, right: 0}
        self.begun = {left: threading.Event(), right: threading.Event()}
        self.at_once = True
        self.threads: set[int] = set()
        self.exchange = collectives.exchange

    def __call__(self, sends, recvs) -> None:
        peers = {peer for t, peer in sends if peer in self.sent}
        self.threads.add(threading.get_ident())
        for peer in peers:
            self.begun[peer].set()
        for other in set(self.sent) - peers if peers else ():
            if not self.begun[other].wait(self.wait_s):
                self.at_once = False
                self.begun[other].set()  # waited once: the rest may go
        for t, peer in sends:
            if peer in self.sent:
                self.sent[peer] += t.numel() * t.element_size()
        self.exchange(sends, recvs)


def _exchange(sends, recvs) -> None:
    """collectives.exchange as it is when called: the counting one while the worker checks."""
    collectives.exchange(sends, recvs)


def own_all_reduce_worker(
    rank: int,
    world_size: int,
    source: str,
    nbytes: int = 2**22,
    rounds: int = 5,
    wait_s: float = 5.0,
) -> dict | EllipsisType:
    """Run the all-reduce in `source` on ranks 0..world_size-1 (at least 3) and say what it did.

    Returns, the same on every rank: `equal` (integers of an uneven size summed exactly as
    all_reduce sums them, on every rank), `to_right` (per rank, the share of the bytes it sent
    that went to its right neighbour: 1.0 for the ring, near 0.5 both ways round), `at_once` (on
    every rank each way's messages began while the other way's were under way), `threads` (the
    most threads that sent messages on one rank), and `seconds`
    (medians of the ring and of the function on `nbytes` of float32). Returns ... if the
    function returned ... (an unanswered exercise). A first message one way waits for the other
    way to begin, up to `wait_s` seconds: only a function that never sends both ways at once
    waits that long.
    """
    _checks.ranks("own_all_reduce_worker", rank, world_size, least=3)
    _checks.whole("own_all_reduce_worker: nbytes", nbytes, least=4)
    _checks.whole("own_all_reduce_worker: rounds", rounds)
    _checks.number("own_all_reduce_worker: wait_s", wait_s, positive=True)
    worker_args.source("own_all_reduce_worker: source", source, "f(x, ranks)")
    fn = worker_args.source_function(
        source,
        threading=threading,
        collectives=collectives,
        exchange=_exchange,
        members=collectives.members,
        flat_view=collectives.flat_view,
    )
    _checks.in_group("own_all_reduce_worker", rank, world_size)
    collectives.open_reverse_links()
    ranks, device = list(range(world_size)), rank_device(rank)
    g = torch.Generator().manual_seed(rank)
    x = torch.randint(-(10**9), 10**9, (1001,), generator=g).to(device)
    expected, mine = x.clone(), x.clone()
    dist.all_reduce(expected)
    left, right = (rank - 1) % world_size, (rank + 1) % world_size
    traffic = _Traffic(left, right, wait_s)
    collectives.exchange = traffic
    try:
        returned = fn(mine, ranks)
    finally:
        collectives.exchange = traffic.exchange
    if returned is ...:  # the starter's body, on every rank alike
        return ...
    sent = sum(traffic.sent.values())
    flags = [torch.equal(mine, expected), traffic.at_once, -len(traffic.threads)]
    flags = torch.tensor(flags, dtype=torch.int64, device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    share = torch.tensor([traffic.sent[right] / max(sent, 1)], device=device)
    shares = [torch.zeros(1, device=device) for _ in ranks]
    dist.all_gather(shares, share)
    data = torch.ones(nbytes // 4, device=device)
    seconds = time_ops(
        {
            "one ring": lambda: collectives.ring_all_reduce(data.clone(), ranks),
            "both ways": lambda: fn(data.clone(), ranks),
        },
        rounds=rounds,
        device=device,
    )
    return {"equal": bool(flags[0]), "to_right": [round(float(t), 4) for t in shares],
            "at_once": bool(flags[1]), "threads": -int(flags[2]), "seconds": seconds}  # fmt: skip


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
