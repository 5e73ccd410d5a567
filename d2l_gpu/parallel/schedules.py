"""Model (layer) parallelism and pipelines from scratch, in one process: stages on devices,
activations sent forward and gradients back, the GPipe and 1F1B schedules, their timelines and
bubble fraction.

Shown in lesson 10. `pipeline.py` runs the same schedules in real processes.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from .. import _checks
from .._typed import wrap_public
from ..devices import try_all_gpus

Action = tuple[str, int]  # ("F", i): forward of micro-batch i; ("B", i): its backward


def stage_devices(k: int) -> list[torch.device]:
    """k devices for k stages: one per accelerator, reused round-robin when there are fewer."""
    _checks.whole("stage_devices: k", k)
    physical = try_all_gpus()
    return [physical[i % len(physical)] for i in range(k)]


def place_stages(stages: list[nn.Module], devices: list[torch.device]) -> list[nn.Module]:
    """A copy of stage s on devices[s] (a real copy, even when devices repeat)."""
    for s in _checks.items("place_stages: stages", stages):
        _checks.module("place_stages: each of stages", s)
    devices = _checks.devices("place_stages: devices", devices, available=True)
    if len(stages) != len(devices):
        raise ValueError(f"{len(stages)} stages but {len(devices)} devices: give one device each")
    return [copy.deepcopy(s).to(d) for s, d in zip(stages, devices, strict=True)]


def stage_forward(stage: nn.Module, h: torch.Tensor, device: torch.device, first=False) -> tuple:
    """Receive activation h on `device` as a new leaf (the cut), run the stage: (input, output)."""
    received = h.detach().to(device)
    if not first and received.is_floating_point():
        received.requires_grad_()  # so that backward stops here and hands us the gradient
    return received, stage(received)


def stage_backward(received: torch.Tensor, out: torch.Tensor, grad: torch.Tensor | None):
    """Backward through one stage from its output's gradient (None: out is the loss); input grad."""
    if not out.requires_grad:
        raise ValueError("stage_backward: out has no graph to go back through (requires_grad off)")
    if grad is None and out.numel() != 1 or grad is not None and grad.shape != out.shape:
        given = "no grad" if grad is None else f"a grad of shape {tuple(grad.shape)}"
        raise ValueError(
            f"stage_backward: out of shape {tuple(out.shape)} with {given}: give the loss alone, "
            "or the gradient of out (its shape)"
        )
    out.backward() if grad is None else out.backward(grad.to(out.device, out.dtype))
    return received.grad


def model_parallel_step(
    stages: list[nn.Module], devices: list[torch.device], X, y, loss_fn=F.cross_entropy
) -> float:
    """Naive model parallelism: forward stage by stage, the loss, backward stage by stage."""
    saved, h = [], X
    for s, (stage, device) in enumerate(zip(stages, devices, strict=True)):
        received, h = stage_forward(stage, h, device, first=s == 0)
        saved.append((received, h))
    loss = loss_fn(h, y.to(h.device))
    grad = stage_backward(saved[-1][0], loss, None)  # the last stage starts from the loss
    for s in reversed(range(len(stages) - 1)):
        grad = stage_backward(saved[s][0], saved[s][1], grad)  # the gradient travels back
    return loss.item()


def gpipe_schedule(p: int, m: int) -> list[list[Action]]:
    """GPipe: each stage runs the forward of all m micro-batches, then all m backwards."""
    if p < 1 or m < 1 or p * m > 10**7:  # 10**7 actions: far beyond any real pipeline
        raise ValueError(f"a pipeline needs 1 <= p, 1 <= m and p*m <= 10**7, got p={p}, m={m}")
    return [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(p)]


def one_f_one_b_schedule(p: int, m: int) -> list[list[Action]]:
    """1F1B: stage s warms up with p-1-s forwards, then alternates forward and backward."""
    if p < 1 or m < 1 or p * m > 10**7:  # 10**7 actions: far beyond any real pipeline
        raise ValueError(f"a pipeline needs 1 <= p, 1 <= m and p*m <= 10**7, got p={p}, m={m}")
    out = []
    for s in range(p):
        warm = min(p - 1 - s, m)
        acts = [("F", i) for i in range(warm)]
        for i in range(m - warm):
            acts += [("F", warm + i), ("B", i)]
        acts += [("B", i) for i in range(m - warm, m)]
        out.append(acts)
    return out


SCHEDULES = {"gpipe": gpipe_schedule, "1f1b": one_f_one_b_schedule}
# torch.distributed.pipelining's schedules with several stages per rank (interleaved.py):
# name -> (its class there, how stages are laid out over the ranks)
INTERLEAVED = {
    "interleaved-1f1b": ("ScheduleInterleaved1F1B", "loop"),
    "interleaved-zero-bubble": ("ScheduleInterleavedZeroBubble", "loop"),
    "zbv-zero-bubble": ("ScheduleZBVZeroBubble", "v"),
}


def _check_schedule(caller: str, schedule) -> list[list[Action]]:
    """`schedule` if it is one list of actions ('F', i) or ('B', i) per stage, else a sentence."""
    rows = _checks.items(f"{caller}: schedule", schedule)
    for s, acts in enumerate(rows):
        seen = set()
        for action in _checks.items(f"{caller}: schedule[{s}]", acts):
            kind, i = action if isinstance(action, (tuple, list)) and len(action) == 2 else (0, 0)
            if kind not in ("F", "B") or isinstance(i, bool) or not isinstance(i, int) or i < 0:
                raise ValueError(
                    f"{caller}: schedule[{s}] holds {action!r}; each action is ('F', i) or "
                    "('B', i), i a micro-batch number >= 0 (see d2l.gpipe_schedule(p, m))"
                )
            if (kind, i) in seen:
                raise ValueError(f"{caller}: schedule[{s}] runs {action!r} twice; once is enough")
            seen.add((kind, i))
    return rows


def bubble_fraction(p: int, m: int) -> float:
    """The idle share of a pipeline of p equal stages and m micro-batches: (p-1)/(m+p-1)."""
    if p < 1 or m < 1:
        raise ValueError(f"a pipeline needs p >= 1 stages and m >= 1 micro-batches, got {p}, {m}")
    return (p - 1) / (m + p - 1)


def _ready(kind: str, s: int, i: int, done: set, p: int) -> bool:
    """May stage s run action (kind, i) now, given the set of finished (kind, stage, i)?"""
    if kind == "F":
        return s == 0 or ("F", s - 1, i) in done
    return ("F", s, i) in done and (s == p - 1 or ("B", s + 1, i) in done)


def walk_schedule(schedule: list[list[Action]]):
    """Yield (stage, kind, micro-batch) in the order the actions of `schedule` can run: the stages
    are swept in turn, each running its next action once what it needs is done. The one walker
    of the simulator and the executor that lesson 10 runs; raises RuntimeError on a schedule that
    deadlocks."""
    return _walk(_check_schedule("walk_schedule", schedule))


def _walk(schedule: list[list[Action]]):
    """The generator behind walk_schedule, which checks the schedule first (at the call)."""
    p = len(schedule)
    pos, done = [0] * p, set[tuple[str, int, int]]()  # (kind, stage, micro-batch)
    while any(pos[s] < len(schedule[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            if pos[s] == len(schedule[s]):
                continue
            kind, i = schedule[s][pos[s]]
            if not _ready(kind, s, i, done, p):
                continue
            yield s, kind, i
            done.add((kind, s, i))
            pos[s] += 1
            progressed = True
        if not progressed:
            raise RuntimeError(
                f"the schedule deadlocks: every stage waits ({pos=}); each stage needs the "
                "forward of a micro-batch before its backward, in an order its neighbours allow"
            )


def simulate_schedule(schedule: list[list[Action]], t_forward=1.0, t_backward=2.0) -> list[tuple]:
    """The timeline of a schedule when every forward takes t_forward and backward t_backward.

    Returns events (stage, kind, micro-batch, start, end); raises on a schedule that deadlocks.
    """
    _check_schedule("simulate_schedule", schedule)
    _checks.number("simulate_schedule: t_forward", t_forward)
    _checks.number("simulate_schedule: t_backward", t_backward)
    p = len(schedule)
    free_at, events = [0.0] * p, []
    finish: dict[tuple[str, int, int], float] = {}  # (kind, stage, micro-batch) -> time
    for s, kind, i in walk_schedule(schedule):
        deps = [("F", s - 1, i)] if kind == "F" and s > 0 else []
        if kind == "B":
            deps = [("F", s, i)] + ([("B", s + 1, i)] if s < p - 1 else [])
        start = max([free_at[s]] + [finish[d] for d in deps])
        end = start + (t_forward if kind == "F" else t_backward)
        events.append((s, kind, i, start, end))
        finish[(kind, s, i)], free_at[s] = end, end
    return events


def idle_fraction(events: list[tuple]) -> float:
    """1 - busy time / (stages x span): the bubble of a timeline (simulated or measured)."""
    events = _checks.items("idle_fraction: events", events)
    stages = {e[0] for e in events}
    span = max(e[4] for e in events) - min(e[3] for e in events)
    if not span > 0:
        raise ValueError(
            f"idle_fraction: the events span {span} s, so there is no idle share to compute; "
            "give events (stage, kind, i, start, end) that take time"
        )
    busy = sum(e[4] - e[3] for e in events)
    return 1.0 - busy / (len(stages) * span)


def max_in_flight(schedule: list[list[Action]]) -> list[int]:
    """Per stage, the most micro-batches held at once (forward done, backward not yet)."""
    peaks = []
    for acts in _check_schedule("max_in_flight", schedule):
        alive = peak = 0
        for kind, _ in acts:
            alive += 1 if kind == "F" else -1
            peak = max(peak, alive)
        peaks.append(peak)
    return peaks


def run_schedule(
    stages: list[nn.Module],
    devices: list[torch.device],
    schedule: list[list[Action]],
    X: torch.Tensor,
    y: torch.Tensor,
    loss_fn=F.cross_entropy,
) -> float:
    """One pipelined step in one process; gradients accumulate as for the whole batch X."""
    _check_run(stages, devices, schedule, X, y)
    p, m = len(stages), len(schedule[0]) // 2
    Xs, ys = X.tensor_split(m), y.tensor_split(m)
    inputs, losses = {}, []
    outputs: dict[tuple[int, int], torch.Tensor] = {}
    grads: dict[tuple[int, int], torch.Tensor] = {}
    for s, kind, i in walk_schedule(schedule):
        if kind == "F":
            h = Xs[i] if s == 0 else outputs[(s - 1, i)]
            inputs[(s, i)], out = stage_forward(stages[s], h, devices[s], first=s == 0)
            if s == p - 1:  # micro-batch loss, weighted so that the sum is the batch mean
                out = loss_fn(out, ys[i].to(out.device), reduction="sum") / len(X)
                losses.append(out.item())
            outputs[(s, i)] = out
        else:
            out = outputs.pop((s, i))
            grad = None if s == p - 1 else grads.pop((s + 1, i))
            grads[(s, i)] = stage_backward(inputs.pop((s, i)), out, grad)
    return sum(losses)


def _check_run(stages, devices, schedule, X, y) -> None:
    """Refuse run_schedule's arguments unless there is one device and one row per stage."""
    counts = (len(_checks.items("run_schedule: stages", stages)),
              len(_checks.devices("run_schedule: devices", devices)),
              len(_check_schedule("run_schedule", schedule)))  # fmt: skip
    if len(set(counts)) > 1:
        raise ValueError(
            "run_schedule got {} stages, {} devices and a schedule of {} stages: give one "
            "device and one row of the schedule per stage".format(*counts)
        )
    if len(X) != len(y):
        raise ValueError(f"run_schedule: X has {len(X)} examples but y has {len(y)}")


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
