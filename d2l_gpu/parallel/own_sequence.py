"""A student's own reduce-scatter along the sequence (sequence parallelism's "g") on real ranks:
the sequence-parallel transformer trained with it in place of the course's, against one device.

Shown in lesson 13 (exercise 4). The function comes as source text (`inspect.getsource`),
because each rank is a new process that cannot import a notebook's cells. It may use `torch` and
`dist`, and is called on every rank as f(x) with x of shape [B, T, D]: it returns the sum of
every rank's x, of which this rank keeps its part of the sequence, [B, T/world, D]. For this run
only, it replaces the course's own function where sequence parallelism uses it: after the
row-parallel layers (`proj`, `fc2`) in forward, and for the gradient of the column-parallel
layers' input (`qkv`, `fc1`) in backward.
"""

from __future__ import annotations

from types import EllipsisType

import torch
import torch.distributed as dist

from .. import _checks
from .._typed import wrap_public
from ..distributed import rank_device
from . import sequence_parallel, worker_args
from .transformer_parallel import full_transformer_parameters
from .workload import TransformerWorkload, train_transformer

ERRORS = (RuntimeError, TypeError, ValueError, AttributeError, IndexError)  # a wrong answer's


def _said_once(error: Exception | None) -> str | None:
    """Every rank's error, gathered, in one sentence; None when no rank had one."""
    mine = None if error is None else f"{type(error).__name__}: {error}"
    errors: list = [None] * dist.get_world_size()
    dist.all_gather_object(errors, mine)
    ranks: dict[str, list[int]] = {}
    for rank, text in enumerate(errors):
        if text is not None:
            ranks.setdefault(text, []).append(rank)
    if not ranks:
        return None
    return "; ".join(
        f"rank{'s' * (len(r) > 1)} {', '.join(map(str, r))} raised {text}"
        for text, r in ranks.items()
    )


def own_sequence_worker(
    rank: int, world_size: int, source: str, work: TransformerWorkload
) -> dict | EllipsisType:
    """Train work's transformer with sequence parallelism, its reduce-scatter the one in `source`.

    Returns, the same on every rank: `equal` (the losses and every parameter within 1e-10 of
    one device's), `gap` (the largest difference, None after an error) and `error` (None, or
    what each rank raised, in a sentence). Returns ... if the function returned ... (an
    unanswered exercise)."""
    sequence_parallel.check_worker_args(rank, world_size, work, "sp", group=False)
    _checks.ranks("own_sequence_worker", rank, world_size, least=2)
    worker_args.source("own_sequence_worker: source", source, "f(x)")
    fn = worker_args.source_function(source)
    _checks.in_group("own_sequence_worker", rank, world_size)
    device = rank_device(rank)
    X, y = (t.to(device) for t in work.data())

    def run():
        probe = torch.zeros(1, world_size, 1, dtype=work.dtype, device=device)
        if fn(probe) is ...:  # the starter's body, on every rank alike
            return ...
        net = sequence_parallel.parallel_transformer(
            work.model().to(device), rank, world_size, True
        )
        sync = sequence_parallel.all_reduce_norm_grads
        return net, train_transformer(net, X, y, work.steps, work.lr, sync)

    result, error = _run_swapped(sequence_parallel, "_reduce_scatter_seq", fn, run)
    if result is ...:
        return ...
    failure = _failed(error)
    if failure is not None:
        return failure
    net, losses = result
    return _against_one_device(work, losses, full_transformer_parameters(net))


def _run_swapped(module, name: str, fn, run):
    """run() with `module.name` replaced by the student's `fn` in this process, put back after:
    (what run returned, None), or (None, the error a wrong answer raised)."""
    course = getattr(module, name)
    setattr(module, name, fn)
    try:
        return run(), None
    except ERRORS as e:
        return None, e
    finally:
        setattr(module, name, course)


def _failed(error: Exception | None) -> dict | None:
    """The result of a run in which some rank raised (every rank's error, said once); None if
    none did. Called on every rank: it gathers."""
    said = _said_once(error)
    return None if said is None else {"equal": False, "gap": None, "error": said}


def _against_one_device(work: TransformerWorkload, losses: list, params: list) -> dict:
    """`equal` and `gap` of a run's losses and full parameters against one device's SGD on
    `work`; the same on every rank (the largest gap over the ranks)."""
    one = work.model()
    reference = train_transformer(one, *work.data(), work.steps, work.lr)
    gaps = [abs(a - b) for a, b in zip(losses, reference, strict=True)]
    pairs = zip(params, one.parameters(), strict=True)
    gaps += [(a.detach().cpu() - b.detach()).abs().max().item() for a, b in pairs]
    gap = torch.tensor([max(gaps)], dtype=torch.float64, device=rank_device())
    dist.all_reduce(gap, op=dist.ReduceOp.MAX)
    return {"equal": gap.item() < 1e-10, "gap": gap.item(), "error": None}


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
