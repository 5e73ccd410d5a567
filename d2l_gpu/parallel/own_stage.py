"""A student's own pipeline stage on real ranks: model parallelism with send and recv, trained for
a few SGD steps and compared with one device, its messages counted by direction.

Shown in lesson 10 (exercise 5). The function comes as source text (`inspect.getsource`), because
each rank is a new process that cannot import a notebook's cells. It may use `torch`, `dist` and
`F` (torch.nn.functional) and is called on every rank, once per step, as
f(stage, X, y, rank, world, width): rank r holds stage r of the MLP; X and y are the whole batch
(the same on every rank); `width` is the number of features of the activation rank r receives.
It runs its stage's forward and backward, sending activations to rank + 1 and gradients to
rank - 1, and returns the loss on the last rank; the worker zeroes the gradients before it and
takes the SGD step after it. A receive that waits `wait_s` seconds raises instead of hanging:
a function in which some message is never sent fails with a sentence, not a stuck notebook.
"""

from __future__ import annotations

from datetime import timedelta
from types import EllipsisType

import torch
import torch.distributed as dist
from torch.nn import functional as F

from .. import _checks
from .._typed import wrap_public
from ..distributed import rank_device
from ..models import mlp
from . import worker_args
from .splitting import split_stages
from .workload import Workload, train_one_device


class NeverCame(RuntimeError):
    """A receive whose message no rank sent within the time allowed."""


class _CountingDist:
    """torch.distributed for the student's function: send and recv count their bytes by peer,
    and a receive is posted only once its message has been sent (a key in the group's store),
    so that one never sent gives up after `wait_s` seconds with a sentence and leaves the group
    usable (a gloo receive that times out closes its connection)."""

    def __init__(self, rank: int, wait_s: float):
        self.rank, self.wait_s = rank, wait_s
        self.sent: dict[int, int] = {}
        self.messages: dict[tuple[int, int], int] = {}  # (src, dst) -> messages so far
        self.store = dist.distributed_c10d._get_default_store()

    def __getattr__(self, name):
        return getattr(dist, name)

    def _key(self, src: int, dst: int) -> str:
        n = self.messages.get((src, dst), 0)
        self.messages[src, dst] = n + 1
        return f"own_stage/{src}->{dst}/{n}"

    def send(self, tensor: torch.Tensor, dst: int, *args, **kwargs) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"rank {self.rank} sent {tensor!r} to rank {dst}, not a tensor: a received "
                "activation needs requires_grad_() before the stage uses it, or its .grad is None"
            )
        self.sent[dst] = self.sent.get(dst, 0) + tensor.numel() * tensor.element_size()
        self.store.set(self._key(self.rank, dst), "sent")
        dist.send(tensor.detach(), dst, *args, **kwargs)

    def recv(self, tensor: torch.Tensor, src: int, *args, **kwargs) -> None:
        try:
            self.store.wait([self._key(src, self.rank)], timedelta(seconds=self.wait_s))
        except (RuntimeError, dist.DistError) as e:
            raise NeverCame(
                f"rank {self.rank} waited {self.wait_s:g} s for a message from rank {src} that "
                "never came: every recv needs a matching send on the other rank",
                src,
                self.rank,
            ) from e
        dist.recv(tensor, src, *args, **kwargs)


def _agreed(error: Exception | None) -> str | None:
    """Every rank's error, gathered and said once: the errors themselves, or else every message
    that never came (a missing send leaves several ranks waiting)."""
    mine = None
    if isinstance(error, NeverCame):
        mine = ("waited", f"rank {error.args[1]} -> rank {error.args[2]}")
    elif error is not None:
        mine = ("raised", f"{type(error).__name__}: {error}")
    errors: list = [None] * dist.get_world_size()
    dist.all_gather_object(errors, mine)
    raised: dict[str, list[int]] = {}  # what was raised -> the ranks that raised it
    for rank, e in enumerate(errors):
        if e and e[0] == "raised":
            raised.setdefault(e[1], []).append(rank)
    if raised:
        return "; ".join(
            f"rank{'s' * (len(r) > 1)} {', '.join(map(str, r))} raised {text}"
            for text, r in raised.items()
        )
    waited = [e[1] for e in errors if e]
    if not waited:
        return None
    return (
        f"messages that never came: {', '.join(waited)} (each receiver waited its time out); "
        "every recv needs a matching send on the other rank"
    )


def own_stage_worker(
    rank: int, world_size: int, source: str, work: Workload, wait_s: float = 20.0
) -> dict | EllipsisType:
    """Train work's MLP with the stage step in `source`, one stage per rank; say what it did.

    Returns, the same on every rank: `equal` (every stage's parameters and the losses within
    1e-10 of one device's SGD), `error` (None, or what went wrong, in a sentence; the group
    stays usable), `losses`, `forward` and `backward` (per rank, the bytes it sent to rank + 1
    and to rank - 1 in all steps) and `activations` (per rank, the bytes of one step's
    activation that a correct stage sends forward: what each of its gradients weighs too).
    Returns ... if the function returned ... (an unanswered exercise).
    """
    _checks.ranks("own_stage_worker", rank, world_size, least=2)
    _checks.job("own_stage_worker", work)
    _checks.number("own_stage_worker: wait_s", wait_s, positive=True)
    worker_args.source("own_stage_worker: source", source, "f(stage, X, y, rank, world, width)")
    counting = _CountingDist(rank, wait_s)
    fn = worker_args.source_function(source, dist=counting, F=F)
    _checks.in_group("own_stage_worker", rank, world_size)
    device = rank_device(rank)
    stages = split_stages(mlp(work.widths, work.seed, work.dtype), world_size)
    X, y = work.data()
    widths = [X.shape[1]]  # the features entering each stage, then leaving the last
    with torch.no_grad():
        h = X
        for s in stages:
            h = s(h)
            widths.append(h.shape[1])
    stage = stages[rank].to(device)
    opt, losses, error = torch.optim.SGD(stage.parameters(), lr=work.lr), [], None
    try:
        for _ in range(work.steps):
            opt.zero_grad()
            loss = fn(stage, X.to(device), y.to(device), rank, world_size, widths[rank])
            if loss is ...:  # the starter's body, on every rank alike
                return ...
            if rank == world_size - 1 and not isinstance(loss, torch.Tensor):
                raise TypeError(f"the last rank's stage step must return the loss, got {loss!r}")
            opt.step()
            losses.append(float(loss) if rank == world_size - 1 else 0.0)
    except (RuntimeError, TypeError, ValueError, AttributeError) as e:  # a wrong answer's
        error = e
    said = _agreed(error)
    if said is not None:
        return {"equal": False, "error": said}
    losses = torch.tensor(losses, dtype=work.dtype, device=device)
    dist.broadcast(losses, world_size - 1)
    losses = losses.tolist()
    one = mlp(work.widths, work.seed, work.dtype)
    reference = train_one_device(one, X, y, work.steps, work.lr)
    mine = split_stages(one, world_size)[rank].parameters()
    gaps = [
        (a.detach().cpu() - b.detach()).abs().max().item()
        for a, b in zip(stage.parameters(), mine, strict=True)
    ]
    gaps += [abs(a - b) for a, b in zip(losses, reference, strict=True)]
    flags = torch.tensor([max(gaps, default=0.0) < 1e-10], dtype=torch.int64, device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    sent = torch.tensor(
        [counting.sent.get(rank + 1, 0), counting.sent.get(rank - 1, 0)], device=device
    )
    every = [torch.zeros_like(sent) for _ in range(world_size)]
    dist.all_gather(every, sent)
    size = torch.finfo(work.dtype).bits // 8
    return {
        "equal": bool(flags[0]),
        "error": None,
        "losses": losses,
        "forward": [int(t[0]) for t in every],
        "backward": [int(t[1]) for t in every],
        "activations": [len(X) * w * size for w in widths[1:-1]] + [0],
    }


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
