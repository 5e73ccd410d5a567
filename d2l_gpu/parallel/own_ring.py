"""A student's own hop of the ring (ring attention's send and receive) on real ranks: the
context-parallel transformer trained with it in place of the course's, against one device.

Shown in lesson 14 (exercise 4). The function comes as source text (`inspect.getsource`),
because each rank is a new process that cannot import a notebook's cells. It may use `torch` and
`dist`, and is called on every rank as f(t) at every step of ring attention, forward and
backward: it posts the send of `t` to the next rank and a receive from the previous one into a
new buffer, and returns (that buffer, the posted works), which the caller waits for after its
computation. At least 3 ranks: with 2 the next rank and the previous one are the same, and a
ring turned the wrong way would pass.
"""

from __future__ import annotations

from types import EllipsisType

import torch

from .. import _checks
from .._typed import wrap_public
from ..distributed import rank_device
from . import context_parallel, cp_worker, worker_args
from .own_sequence import _against_one_device, _failed, _run_swapped
from .workload import TransformerWorkload


def own_ring_worker(
    rank: int, world_size: int, source: str, work: TransformerWorkload, layout: str = "zigzag"
) -> dict | EllipsisType:
    """Train work's transformer context-parallel, each hop of its rings the one in `source`.

    Returns, the same on every rank: `equal` (the losses and every parameter within 1e-10 of
    one device's), `gap` (the largest difference, None after an error) and `error` (None, or
    what each rank raised, in a sentence). Returns ... if the function returned ... (an
    unanswered exercise)."""
    _checks.ranks("own_ring_worker", rank, world_size, least=3)
    if not isinstance(work, TransformerWorkload):
        kind = type(work).__name__
        raise TypeError(f"own_ring_worker: work must be a TransformerWorkload, got {kind}")
    context_parallel._check(world_size, layout, work.seq_len)
    worker_args.source("own_ring_worker: source", source, "f(t)")
    fn = worker_args.source_function(source)
    _checks.in_group("own_ring_worker", rank, world_size)

    def run():
        probe = fn(torch.zeros(2, dtype=work.dtype, device=rank_device(rank)))
        if probe is ...:  # the starter's body, on every rank alike
            return ...
        for w in probe[1]:
            w.wait()
        return cp_worker.context_parallel_worker(rank, world_size, work, layout)

    result, error = _run_swapped(context_parallel, "_pass_on", fn, run)
    if result is ...:
        return ...
    return _failed(error) or _against_one_device(work, result["losses"], result["params"])


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
