"""Sequence parallelism on top of the transformer's tensor parallelism (Megatron-SP), and the
worker that trains the small transformer four ways: 'tp' and 'sp' by hand, 'torch_tp' and
'torch_sp' with parallelize_module (transformer_parallel.py builds the blocks). Shown in
lesson 13.

Under SP the residual stream and the LayerNorms hold 1/world of the sequence. Before qkv and fc1
an all-gather along the sequence replaces tensor parallelism's identity "f"; after proj and fc2
a reduce-scatter along the sequence replaces its all-reduce "g"; backward swaps the two (an
all-reduce is a reduce-scatter plus an all-gather: the same bytes). qkv and fc1 keep only their
input's slice and gather it again in backward (Megatron's choice: one more all-gather for 1/world
of those activations), so no activation outside attention and MLP is replicated. The
replicated parameters that see only this rank's tokens (norms, the row-parallel biases) need
their gradients summed over ranks: `all_reduce_norm_grads`. Collectives follow NCCL's rules
(contiguous buffers, all_gather_into_tensor, reduce_scatter_tensor) but ran only on gloo.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from .. import _checks
from .._typed import wrap_public
from ..distributed import all_reduce_together, rank_device
from ..gpt import TransformerBlock
from .footprint import CollectiveCounter, MemoryMeter
from .tensor_parallel import _GatherSlices
from .transformer_parallel import (
    HeadParallelBlock,
    check_heads,
    full_transformer_parameters,
    parallelize_transformer,
    tensor_parallel_block,
)
from .workload import TransformerWorkload, train_transformer, transformer_loss

MODES = ("tp", "sp", "torch_tp", "torch_sp")


def _gather_seq(x: torch.Tensor) -> torch.Tensor:
    """All ranks' sequence slices [B, T/world, D] put together as [B, T, D]."""
    world = dist.get_world_size()
    out = torch.empty(
        (world * x.shape[1], x.shape[0], *x.shape[2:]), dtype=x.dtype, device=x.device
    )
    dist.all_gather_into_tensor(out, x.transpose(0, 1).contiguous())  # gathers along dim 0
    return out.transpose(0, 1).contiguous()


def _reduce_scatter_seq(x: torch.Tensor) -> torch.Tensor:
    """The sum over ranks of x [B, T, D], each rank keeping its slice [B, T/world, D]."""
    world = dist.get_world_size()
    out = torch.empty(
        (x.shape[1] // world, x.shape[0], *x.shape[2:]), dtype=x.dtype, device=x.device
    )
    dist.reduce_scatter_tensor(out, x.transpose(0, 1).contiguous())  # scatters along dim 0
    return out.transpose(0, 1).contiguous()


class _GatherThenLinear(torch.autograd.Function):
    """Forward: all-gather the sequence (SP's "f"), then x W^T + b, keeping only x's slice.
    Backward: all-gather x again for W's gradient; reduce-scatter x's gradient (f reversed)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)  # the slice: 1/world of the gathered input
        return F.linear(_gather_seq(x), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        full, g = _gather_seq(x).flatten(0, -2), grad.flatten(0, -2)
        return _reduce_scatter_seq(grad @ weight), g.T @ full, g.sum(0)


class _ReduceScatterSequence(torch.autograd.Function):
    """Forward: sum the partial results, keep this rank's slice (SP's "g"). Backward: all-gather."""

    @staticmethod
    def forward(ctx, x):
        return _reduce_scatter_seq(x)

    @staticmethod
    def backward(ctx, grad):
        return _gather_seq(grad)


class _KeepMySlice(torch.autograd.Function):
    """Forward: this rank's slice of the (replicated) sequence. Backward: all-gather."""

    @staticmethod
    def forward(ctx, x):
        world, rank = dist.get_world_size(), dist.get_rank()
        if x.shape[1] % world:
            raise ValueError(
                f"sequence parallelism: seq_len={x.shape[1]} is not a multiple of world={world}; "
                "choose a length the ranks divide"
            )
        return x.chunk(world, dim=1)[rank].contiguous()

    @staticmethod
    def backward(ctx, grad):
        return _gather_seq(grad)


class ScatterSequence(nn.Module):
    """Enter the sequence-parallel region: keep this rank's slice of the tokens."""

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return _KeepMySlice.apply(X)


class GatherSequence(nn.Module):
    """Leave the sequence-parallel region: every rank gets the whole sequence."""

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return _GatherSlices.apply(X, 1)


def sp_column(X: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """A column-parallel layer on the gathered sequence; X, the slice it keeps: [B, T/world, D]."""
    return _GatherThenLinear.apply(X, layer.weight, layer.bias)


def sp_row(X: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """A row-parallel layer whose partial sums are reduce-scattered along the sequence; + bias."""
    return _ReduceScatterSequence.apply(F.linear(X, layer.weight)) + layer.bias


def sequence_parallel_block(block: TransformerBlock, rank: int, world: int) -> nn.Module:
    """This rank's heads and hidden units of `block`, its input and output [B, T/world, D]."""
    _checks.ranks("sequence_parallel_block", rank, world)
    check_heads("sequence_parallel_block", block, world)
    return HeadParallelBlock(block, world, rank, sp_column, sp_row)


def parallel_transformer(
    net: nn.Sequential, rank: int, world: int, sequence_parallel: bool
) -> nn.Sequential:
    """A split copy of `net` (d2l.transformer): blocks split by hand; embedding, head whole."""
    _checks.module("parallel_transformer: net", net, sequential=True)
    _checks.ranks("parallel_transformer", rank, world)
    units = []
    for unit in net:
        if not isinstance(unit, TransformerBlock):
            units.append(copy.deepcopy(unit))
        else:
            split = sequence_parallel_block if sequence_parallel else tensor_parallel_block
            units.append(split(unit, rank, world))
    if sequence_parallel:  # after the embedding, and before the final norm
        units.insert(1, ScatterSequence())
        units.insert(len(units) - 2, GatherSequence())
    return nn.Sequential(*units)


def all_reduce_norm_grads(net: nn.Module) -> None:
    """Sum over ranks the gradients of SP's replicated parameters (one all-reduce, coalesced).

    The norms and the biases of proj and fc2 act on this rank's tokens only, so each rank holds
    a part of their gradient; tensor parallelism alone needs no such step.
    """
    _checks.module("all_reduce_norm_grads: net", net)
    _checks.in_group("all_reduce_norm_grads")
    names = ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias", "proj.bias", "fc2.bias")
    grads = [
        p.grad
        for m in net.modules()
        if isinstance(m, HeadParallelBlock) and m.row is sp_row
        for name, p in m.named_parameters()
        if name in names and p.grad is not None
    ]
    all_reduce_together(grads)


def activation_bytes_per_rank(work: TransformerWorkload, world: int, mode: str) -> int:
    """Predicted bytes the blocks keep for backward on one rank, per the per-layer count.

    Per layer, in units of batch*seq*d_model elements (the attention's own statistics aside):
    attention and MLP keep q, k, v, the attention output and proj's input (5), fc1's output and
    the GELU's output (8), all split over ranks: 13/world. Outside them, the inputs of the two
    norms and of qkv and fc1 (4) are replicated in TP: 4 + 13/world. SP by hand keeps all of
    them as sequence slices (qkv and fc1 keep their input's slice and gather it again in
    backward): 17/world. torch_sp's Linear keeps the gathered input: 2 + 15/world.
    """
    check_worker_args(0, world, work, mode, group=False)
    bsh = work.batch_size * work.seq_len * work.d_model
    per_layer = {"sp": 17 / world, "torch_sp": 2 + 15 / world}.get(mode, 4 + 13 / world)
    return round(per_layer * bsh * work.num_layers) * (torch.finfo(work.dtype).bits // 8)


def check_worker_args(
    rank: int,
    world: int,
    work: TransformerWorkload,
    mode: str,
    *,
    group: bool = True,
) -> None:
    """Refuse bad worker arguments in one sentence, before any collective is called."""
    caller = "transformer_parallel_worker"
    _checks.ranks(caller, rank, world)
    if not isinstance(work, TransformerWorkload):
        raise TypeError(f"{caller}: work must be a TransformerWorkload, got {type(work).__name__}")
    _checks.one_of(f"{caller}: mode", mode, MODES)
    if work.num_heads % world or (4 * work.d_model) % world:
        raise ValueError(
            f"{caller}: num_heads={work.num_heads} and ffn={4 * work.d_model} must be multiples "
            f"of world={world}; start a number of ranks that divides the heads"
        )
    if mode in ("sp", "torch_sp") and work.seq_len % world:
        raise ValueError(
            f"{caller}: seq_len={work.seq_len} is not a multiple of world={world}, which "
            "sequence parallelism needs; choose a length the ranks divide"
        )
    if group:
        _checks.in_group(caller, rank, world)


def transformer_parallel_worker(
    rank: int, world: int, work: TransformerWorkload, mode: str = "tp"
) -> dict:
    """Train the split transformer (every rank sees the whole batch); compare with one device.

    Returns the losses, the full parameters after training, the collectives of the first step
    (calls and bytes), the measured peak bytes of one forward+backward (`peak`, gradients
    already allocated) and the predicted activation bytes (`predicted`).
    """
    check_worker_args(rank, world, work, mode)
    device = rank_device()
    X, y = (t.to(device) for t in work.data())
    full = work.model().to(device)
    sp = mode in ("sp", "torch_sp")
    if mode.startswith("torch"):
        from torch.distributed.device_mesh import init_device_mesh

        net = parallelize_transformer(full, init_device_mesh(device.type, (world,)), sp)
    else:
        net = parallel_transformer(full, rank, world, sp)
    sync = all_reduce_norm_grads if mode == "sp" else None
    with CollectiveCounter() as counter:  # the first step: what one step sends
        losses = train_transformer(net, X, y, 1, work.lr, sync)
    losses += train_transformer(net, X, y, work.steps - 1, work.lr, sync) if work.steps > 1 else []
    params = [p.cpu() for p in full_transformer_parameters(net)]
    peaks = []
    # The profiler misses frees made on gloo's threads, so it can only overstate a peak, by
    # 4 KiB buffers, in about half the runs here: the smallest of ten.
    for _ in range(10):
        net.zero_grad(set_to_none=False)
        with MemoryMeter(device) as meter:
            transformer_loss(net, X, y).backward()
        peaks.append(meter.peak)
    return {
        "losses": losses,
        "params": params,
        "calls": counter.calls,
        "bytes": counter.bytes,
        "peak": min(peaks),
        "peaks": peaks,
        "predicted": activation_bytes_per_rank(work, world, mode),
    }


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
