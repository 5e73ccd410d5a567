"""Three ways to split a network over k devices (by data, by layers, by channels) and what each
costs, counted unit by unit; the models the lessons split live in d2l_gpu.models.

Shown in lesson 10.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .. import _checks
from .._typed import wrap_public


def layer_table(net: nn.Sequential, X: torch.Tensor) -> list[dict]:
    """Per unit (child) of `net`: parameters, outputs per example, forward FLOPs per example."""
    _check_net_and_batch("layer_table", net, X)
    rows, h, was_training = [], X, net.training
    net.eval()  # the same FLOPs, and BatchNorm's running statistics stay untouched
    with torch.no_grad():
        for name, unit in net.named_children():
            with FlopCounterMode(display=False) as counter:
                h = unit(h)
            rows.append(
                {
                    "name": f"{name}: {type(unit).__name__}",
                    "params": sum(p.numel() for p in unit.parameters()),
                    "out": h[0].numel(),
                    "flops": counter.get_total_flops() / len(X),
                }
            )
    net.train(was_training)
    return rows


def balanced_cuts(costs: list[float], k: int) -> list[int]:
    """Cut `costs` into k contiguous groups with the smallest largest sum; return the k+1 bounds.

    A cut never falls just before a unit that costs nothing: such units join the group before
    them, so that a cut after a convolution sends the activation after its ReLU and pooling."""
    costs = _checks.items("balanced_cuts: costs", costs)
    for c in costs:
        _checks.number("balanced_cuts: each of costs", c)
    _checks.whole("balanced_cuts: k", k)
    n = len(costs)
    if not 1 <= k <= n:
        raise ValueError(f"cannot cut {n} units into {k} stages: need 1 <= stages <= {n}")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[j][i]: the smallest largest sum cutting units[:i] into j groups; how[j][i]: last cut
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    how = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for j in range(1, k + 1):
        for i in range(j, n + 1):
            for c in range(j - 1, i):
                value = max(best[j - 1][c], prefix[i] - prefix[c])
                if value < best[j][i]:
                    best[j][i], how[j][i] = value, c
    bounds, i = [n], n
    for j in range(k, 0, -1):
        i = how[j][i]
        bounds.append(i)
    bounds = bounds[::-1]
    for s in range(1, k):  # units that cost nothing (ReLU, pooling) stay with the unit before them
        while bounds[s] < bounds[s + 1] - 1 and costs[bounds[s]] == 0:
            bounds[s] += 1
    return bounds


def split_stages(net: nn.Sequential, k: int, costs: list[float] | None = None) -> list:
    """Cut `net` into k consecutive stages (copies), balancing `costs` (default: unit counts)."""
    units = list(_checks.module("split_stages: net", net, sequential=True).children())
    if costs is not None and len(costs) != len(units):
        raise ValueError(
            f"split_stages: costs has {len(costs)} values but net has {len(units)} units; "
            "give one cost per child of net (or costs=None to count units)"
        )
    bounds = balanced_cuts(costs if costs is not None else [1.0] * len(units), k)
    pairs = zip(bounds, bounds[1:], strict=False)
    return [copy.deepcopy(nn.Sequential(*units[a:b])) for a, b in pairs]


def split_costs(net: nn.Sequential, X: torch.Tensor, k: int, bytes_per_number: int = 4) -> dict:
    """Per device and step, for batch X on k devices: parameters, FLOPs, bytes sent, by strategy."""
    _check_net_and_batch("split_costs", net, X)
    _checks.whole("split_costs: k", k)
    _checks.whole("split_costs: bytes_per_number", bytes_per_number)
    rows = layer_table(net, X[:1])
    B, b = len(X), bytes_per_number
    P = sum(r["params"] for r in rows)
    flops = [r["flops"] * B for r in rows]
    bounds = balanced_cuts(flops, k)
    stages = list(zip(bounds, bounds[1:], strict=False))
    # layers: a stage sends its output forward and the gradient of its input backward
    sends = [
        (rows[b_ - 1]["out"] if b_ < len(rows) else 0) + (rows[a - 1]["out"] if a > 0 else 0)
        for a, b_ in stages
    ]
    frac = (k - 1) / k
    channels = channel_split(net, X[:1])
    kept = [i for i in range(len(rows)) if i not in channels["split_units"]]
    return {
        "data": {
            "params": P,
            "flops": sum(flops) / k,
            "bytes_sent": 2 * frac * P * b,  # a ring all-reduce of every gradient
        },
        "layers": {
            "params": max(sum(r["params"] for r in rows[a:b_]) for a, b_ in stages),
            "flops": max(sum(flops[a:b_]) for a, b_ in stages),
            "bytes_sent": max(sends) * B * b,
        },
        "channels": {  # the split units' share, plus the replicated units whole
            "params": (P - sum(rows[i]["params"] for i in kept)) / k
            + sum(rows[i]["params"] for i in kept),
            "flops": (sum(flops) - sum(flops[i] for i in kept)) / k + sum(flops[i] for i in kept),
            # ring collectives: a gather sends (k-1)/k of the whole, an all-reduce twice that
            "bytes_sent": frac * (channels["gathered"] + 2 * channels["reduced"]) * B * b,
        },
    }


def channel_split(net: nn.Sequential, X: torch.Tensor) -> dict:
    """What the lessons' tensor parallelism exchanges per example of X, and which units it splits.

    Every Conv2d (also inside a unit) is split by output channels: its output is all-gathered
    forward, its input's gradient all-reduced backward (lesson 10). Every (Linear, any, Linear)
    run of units is a Megatron pair, and every TransformerBlock is split the Megatron way: one
    all-reduce forward and one backward per pair, per attention and per MLP, as the transformer
    blocks are split by `tensor_parallel_block`. Shown in lesson 10.
    The input of `net` needs no gradient. Other units are replicated and exchange nothing."""
    from ..gpt import TransformerBlock

    units = list(net.children())
    pairs, i = {}, 0
    while i < len(units):
        if i + 2 < len(units) and all(isinstance(units[j], nn.Linear) for j in (i, i + 2)):
            pairs[i] = i + 2
            i += 3
        else:
            i += 1
    split_units = {i for i, u in enumerate(units) if isinstance(u, TransformerBlock)}
    split_units |= {j for i, last in pairs.items() for j in range(i, last + 1)}
    found = {"gathered": 0, "reduced": 0}
    first = X[:1]

    def conv(module, inputs, output):
        found["gathered"] += output[0].numel()
        found["reduced"] += 0 if inputs[0] is first else inputs[0][0].numel()

    def block(module, inputs, output):  # attention and MLP: an all-reduce each, each way
        found["reduced"] += 4 * inputs[0][0].numel()

    def pair_in(module, inputs):
        found["reduced"] += 0 if inputs[0] is first else inputs[0][0].numel()

    def pair_out(module, inputs, output):
        found["reduced"] += output[0].numel()

    hooks = []
    for i, unit in enumerate(units):
        if isinstance(unit, TransformerBlock):
            hooks.append(unit.register_forward_hook(block))
        elif i in pairs:
            hooks.append(unit.register_forward_pre_hook(pair_in))
            hooks.append(units[pairs[i]].register_forward_hook(pair_out))
        else:
            for module in unit.modules():
                if isinstance(module, nn.Conv2d):
                    hooks.append(module.register_forward_hook(conv))
                    split_units.add(i)
    was_training = net.training
    net.eval()
    try:
        with torch.no_grad():
            net(first)
    finally:
        for hook in hooks:
            hook.remove()
        net.train(was_training)
    return {**found, "split_units": split_units}


def _check_net_and_batch(caller: str, net, X) -> None:
    """Refuse a net that is not an nn.Sequential of units, or X that is not a batch of examples."""
    if not list(_checks.module(f"{caller}: net", net, sequential=True).children()):
        raise ValueError(f"{caller}: net is an empty nn.Sequential; give it the layers to count")
    if not isinstance(X, torch.Tensor) or X.dim() == 0 or len(X) == 0:
        what = f"shape {tuple(X.shape)}" if isinstance(X, torch.Tensor) else repr(X)
        raise ValueError(f"{caller}: X must be a batch of at least one example, got {what}")
    if not X.is_floating_point():
        raise TypeError(f"{caller}: X must hold floating-point numbers, got {X.dtype}")


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
