"""A real backward pass overlapped with its gradients' all-reduces, timed and traced (lesson 12).

`costmodel.overlap_worker` stands a sleep in for each layer's backward: a device computing while
the CPU waits. Here the backward is real: a stack of Linear layers computes its gradients on the
rank's device, and a hook on every weight (`register_post_accumulate_grad_hook`, the hook DDP
uses) starts an asynchronous all-reduce of a bucket as soon as the bucket's last gradient is
stored: DDP by hand. gloo runs it on a thread of its own, so on a CPU computing and sending share
the same cores; NCCL runs it on a stream of its own. `backward_overlap_worker` times the
schedules, checks that they end with the summed gradients, and profiles one overlapped step on
rank 0: a Chrome trace that Perfetto opens and `d2l.plot_trace` draws. Only gloo ran it here.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from .._typed import wrap_public
from ..distributed import rank_device
from ..profiling import communication_and_compute, gradient_op, overlap_us, profile_step, spans
from . import worker_args
from .costmodel import time_ops

__all__ = ["backward_overlap_worker", "layer_stack"]

LAUNCH = "c10d::allreduce_"  # the trace's event for starting an all-reduce, on the caller's thread


def layer_stack(layers: int, width: int, seed: int = 0) -> nn.Sequential:
    """`layers` bias-free Linear(width, width) layers with tanh between: 4 width² bytes each."""
    torch.manual_seed(seed)
    parts: list[nn.Module] = []
    for _ in range(layers):
        parts += [nn.Linear(width, width, bias=False), nn.Tanh()]
    return nn.Sequential(*parts)


def stack_and_backward(layers: int, width: int, batch: int, rank: int, device: torch.device):
    """layer_stack on `device`, and a function computing its gradients on `rank`'s own batch."""
    net = layer_stack(layers, width).to(device)
    X = torch.randn(batch, width, generator=torch.Generator().manual_seed(rank)).to(device)

    def backward() -> None:
        net.zero_grad(set_to_none=False)
        (net(X) ** 2).mean().backward()

    return net, backward


def summed_gap(params: list, backward, step, group=None) -> float:
    """How far `step` leaves the gradients of `params` from the collective library's sum of every
    rank's own (computed by `backward`), relative to the largest summed gradient."""
    backward()
    expected = [p.grad.clone() for p in params]
    for g in expected:
        dist.all_reduce(g, group=group)
    step()
    largest = max(g.abs().max().item() for g in expected)
    pairs = zip(params, expected, strict=True)
    return max((p.grad - g).abs().max().item() for p, g in pairs) / largest


class _Buckets:
    """Gradients grouped into buckets, last layer first; each sent when its last one is stored."""

    def __init__(self, weights: list[nn.Parameter], per_bucket: int):
        order = list(reversed(weights))  # the order backward stores them in
        self.buckets = [order[i : i + per_bucket] for i in range(0, len(order), per_bucket)]
        self.of = {id(w): b for b, bucket in enumerate(self.buckets) for w in bucket}
        self.flats = [weights[0].new_zeros(sum(w.numel() for w in b)) for b in self.buckets]
        self.ready = [0] * len(self.buckets)
        self.sent: list | None = None  # the all-reduces in flight, while an overlapped step runs
        for w in weights:
            w.register_post_accumulate_grad_hook(self._stored)

    def _stored(self, weight: nn.Parameter) -> None:
        if self.sent is None:  # a step that does not overlap
            return
        b = self.of[id(weight)]
        self.ready[b] += 1
        if self.ready[b] == len(self.buckets[b]):  # the bucket is complete: start its all-reduce
            self.pack(b)
            self.sent.append(dist.all_reduce(self.flats[b], async_op=True))

    def pack(self, b: int) -> None:
        """Copy bucket b's gradients into its flat buffer."""
        torch.cat([w.grad.flatten() for w in self.buckets[b]], out=self.flats[b])

    def unpack(self) -> None:
        """Copy the summed buffers back into the gradients, as DDP does after its all-reduces."""
        for bucket, flat in zip(self.buckets, self.flats, strict=True):
            for w, part in zip(bucket, flat.split([w.numel() for w in bucket]), strict=True):
                w.grad.copy_(part.view_as(w))


def backward_overlap_worker(
    rank: int,
    world_size: int,
    layers: int,
    width: int,
    batch: int,
    per_bucket: int,
    folder: str | None = None,
    rounds: int = 5,
) -> dict:
    """Seconds of a real backward pass and its buckets' all-reduces, 4 schedules (lesson 12)."""
    # 'after backward' sums every bucket once all gradients exist; 'buckets' starts each bucket's
    # all-reduce while the backward goes on. Both must end with every rank holding the sum of all
    # ranks' gradients (checked against dist.all_reduce of each rank's own). With `folder`, rank 0
    # profiles one step of each and saves the traces there (after-backward.json, buckets.json).
    worker_args.backward_overlap(rank, world_size, layers, width, batch, per_bucket, folder, rounds)
    device = rank_device(rank)
    net, backward = stack_and_backward(layers, width, batch, rank, device)
    weights = [m.weight for m in net if isinstance(m, nn.Linear)]
    buckets = _Buckets(weights, per_bucket)

    def after_backward() -> None:
        backward()
        for b, flat in enumerate(buckets.flats):
            buckets.pack(b)
            dist.all_reduce(flat)
        buckets.unpack()

    def overlapped() -> None:
        buckets.sent, buckets.ready = [], [0] * len(buckets.buckets)
        try:
            backward()  # the hooks start each bucket's all-reduce as soon as it is complete
            for work in buckets.sent:
                work.wait()
        finally:
            buckets.sent = None
        buckets.unpack()

    found: dict = {"rel_diff": {}}  # every schedule must end with every rank's gradients summed
    for name, step in (("after backward", after_backward), ("buckets", overlapped)):
        found["rel_diff"][name] = summed_gap(weights, backward, step)
    ops = {
        "backward alone": backward,
        "all-reduces alone": lambda: [dist.all_reduce(f) for f in buckets.flats],
        "after backward": after_backward,
        "buckets": overlapped,
    }
    found["seconds"] = time_ops(ops, rounds, device=device)
    if folder is not None:
        steps = {"after backward": after_backward, "buckets": overlapped}
        found["traces"] = _traced(rank, steps, folder, device)
    return found


def _traced(rank: int, steps: dict, folder: str, device: torch.device) -> dict:
    """Profile one step of each schedule on rank 0 (the others step alongside); what each shows."""
    if rank != 0:
        for step in steps.values():
            for _ in range(2):
                step()
        return {}
    comm, compute = communication_and_compute(device)
    found = {}
    for name, step in steps.items():
        path = Path(folder) / f"{name.replace(' ', '-')}.json"
        events = profile_step(step, path, device=device, warmup=1)
        computed, sent = spans(events, compute), spans(events, comm)
        last_gradient = max(e["start"] for e in events if gradient_op(e))
        launches = [e["start"] for e in events if e["name"] == LAUNCH]  # on this thread, in order
        found[name] = {
            "path": str(path),
            "all_reduces": sum(comm(e) for e in events),
            "launched_in_backward": sum(t < last_gradient for t in launches),
            "compute_ms": sum(b - a for a, b in computed) / 1e3,
            "comm_ms": sum(b - a for a, b in sent) / 1e3,
            "overlap_ms": overlap_us(events, compute, comm) / 1e3,
        }
    return found


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
