"""Tensor parallelism for the small transformer of gpt.py, Megatron style: each rank holds some
of the attention heads and a block of the MLP's hidden units, built by hand from a reference
block's weights, and the same with PyTorch's `parallelize_module` (DTensor).

The fused qkv layer stacks [q; k; v], each d_model rows with the heads contiguous inside. A
rank needs the q, k and v rows of ITS heads, which are not one contiguous slice, so both
versions first regroup the rows as [q_0; k_0; v_0; q_1; k_1; v_1; ...] (rank r's heads in block
r); then an even split by output rows, as ColwiseParallel does, gives each rank its heads. The
block's forward reads the number of heads from the qkv output (the local count), not from
`num_heads`. The job both train (`TransformerWorkload`) and its SGD loop are in workload.py; the
sequence-parallel variant and the worker live in sequence_parallel.py. Ran only on gloo.
Shown in lesson 13.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from .. import _checks
from .._typed import wrap_public
from ..distributed import dtensor_api
from ..gpt import TransformerBlock
from .tensor_parallel import _CopyToRanks, _my_slice, _SumOverRanks

SPLIT_DIM = {"qkv.weight": 0, "qkv.bias": 0, "fc1.weight": 0, "fc1.bias": 0}
SPLIT_DIM |= {"proj.weight": 1, "fc2.weight": 1}  # row-parallel: their input features
SPLIT_LAYERS = ("proj", "fc1", "fc2")


def check_heads(caller: str, block, world: int) -> None:
    """Refuse a block whose heads or hidden units do not split evenly over `world` ranks."""
    if not isinstance(block, TransformerBlock):
        raise TypeError(f"{caller}: block must be a d2l.TransformerBlock, got {type(block)}")
    heads, ffn = block.num_heads, block.fc1.out_features
    if heads % world or ffn % world:
        raise ValueError(
            f"{caller}: num_heads={heads} and ffn={ffn} must both be multiples of world="
            f"{world}; choose a number of ranks that divides them"
        )


def group_qkv(t: torch.Tensor, world: int) -> torch.Tensor:
    """qkv rows [q; k; v] regrouped as [q_0; k_0; v_0; q_1; ...]: rank r's heads in block r."""
    _check_qkv("group_qkv", t, world)
    return (
        t.reshape(3, world, t.shape[0] // (3 * world), *t.shape[1:]).transpose(0, 1).flatten(0, 2)
    )


def ungroup_qkv(t: torch.Tensor, world: int) -> torch.Tensor:
    """The inverse of group_qkv: back to the fused layer's [q; k; v] order."""
    _check_qkv("ungroup_qkv", t, world)
    return (
        t.reshape(world, 3, t.shape[0] // (3 * world), *t.shape[1:]).transpose(0, 1).flatten(0, 2)
    )


def _check_qkv(caller: str, t: torch.Tensor, world: int) -> None:
    _checks.whole(f"{caller}: world", world)
    if t.dim() == 0 or t.shape[0] % (3 * world):
        raise ValueError(
            f"{caller}: t must have rows [q; k; v] that split over world={world} ranks (a multiple "
            f"of {3 * world}), got shape {tuple(t.shape)}"
        )


def _linear(weight: torch.Tensor, bias: torch.Tensor) -> nn.Linear:
    """An nn.Linear holding copies of `weight` and `bias` (so parameter names stay the same)."""
    layer = nn.Linear(weight.shape[1], weight.shape[0], dtype=weight.dtype, device=weight.device)
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(bias)
    return layer


class HeadParallelBlock(nn.Module):
    """A TransformerBlock holding this rank's heads and hidden units (or all, grouped by rank).

    `column(X, layer)` computes qkv and fc1 with the "f" collective before them, `row(X, layer)`
    proj and fc2 with the "g" after them (before the bias); None leaves the layers whole and
    plain, for DTensor to split.
    `regroup=False` splits qkv's rows contiguously instead: the wrong heads (a negative control).
    """

    def __init__(
        self,
        block: TransformerBlock,
        world: int,
        rank: int | None = None,
        column=None,
        row=None,
        regroup: bool = True,
    ):
        super().__init__()
        _checks.whole("HeadParallelBlock: world", world)
        if rank is not None:
            _checks.ranks("HeadParallelBlock", rank, world)
        check_heads("HeadParallelBlock", block, world)
        self.head_dim = block.qkv.in_features // block.num_heads
        self.world, self.regroup, self.column, self.row = world, regroup, column, row
        self.ln1, self.ln2 = copy.deepcopy(block.ln1), copy.deepcopy(block.ln2)
        w, b = block.qkv.weight.detach(), block.qkv.bias.detach()
        if regroup:
            w, b = group_qkv(w, world), group_qkv(b, world)
        self.qkv = _linear(w, b)
        self.proj, self.fc1, self.fc2 = (copy.deepcopy(getattr(block, n)) for n in SPLIT_LAYERS)
        if rank is not None:  # keep this rank's slices: qkv, fc1 by rows; proj, fc2 by columns
            for name, p in list(self.named_parameters()):
                if name in SPLIT_DIM:
                    layer, attr = name.split(".")
                    setattr(getattr(self, layer), attr, _my_slice(p, SPLIT_DIM[name], rank, world))

    def _column(self, layer: nn.Linear, X: torch.Tensor) -> torch.Tensor:
        return layer(X) if self.column is None else self.column(X, layer)

    def _row(self, layer: nn.Linear, X: torch.Tensor) -> torch.Tensor:
        return layer(X) if self.row is None else self.row(X, layer)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        q, k, v = self._column(self.qkv, self.ln1(X)).chunk(3, dim=-1)  # this rank's heads
        q, k, v = (t.unflatten(-1, (-1, self.head_dim)).transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        X = X + self._row(self.proj, att.transpose(1, 2).flatten(2))
        return X + self._row(self.fc2, F.gelu(self._column(self.fc1, self.ln2(X))))


def tp_column(X: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """A column-parallel layer after "f" (forward: identity; backward: all-reduce)."""
    return F.linear(_CopyToRanks.apply(X), layer.weight, layer.bias)


def tp_row(X: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """A row-parallel layer, then "g" (forward: all-reduce; backward: identity), then the bias."""
    return _SumOverRanks.apply(F.linear(X, layer.weight)) + layer.bias  # the bias once


def tensor_parallel_block(block: TransformerBlock, rank: int, world: int) -> nn.Module:
    """This rank's part of `block`: its heads and hidden units; one all-reduce per sub-layer."""
    _checks.ranks("tensor_parallel_block", rank, world)
    check_heads("tensor_parallel_block", block, world)
    return HeadParallelBlock(block, world, rank, tp_column, tp_row)


def _full(p: torch.Tensor, dim: int | None) -> torch.Tensor:
    """The whole of a parameter: a DTensor's full tensor, a slice all-gathered, or p itself."""
    p = p.detach()
    if hasattr(p, "full_tensor"):
        return p.full_tensor()
    if dim is None:
        return p.clone()
    parts = [torch.empty_like(p) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, p.contiguous())
    return torch.cat(parts, dim=dim)


def full_transformer_parameters(net: nn.Module) -> list[torch.Tensor]:
    """Every parameter of a split transformer, whole, in the one-device model's order and layout."""
    _checks.module("full_transformer_parameters: net", net)
    out = []
    for module in net.children():
        sliced = isinstance(module, HeadParallelBlock) and module.column is not None
        for name, p in module.named_parameters():
            full = _full(p, SPLIT_DIM.get(name) if sliced else None)
            regrouped = isinstance(module, HeadParallelBlock) and module.regroup
            out.append(ungroup_qkv(full, module.world) if regrouped and name[:3] == "qkv" else full)
    return out


def parallelize_transformer(net: nn.Sequential, mesh, sequence_parallel: bool) -> nn.Sequential:
    """Split `net` (from d2l.transformer, or without sequence parallelism a pipeline stage of
    one: a run of its units holding a block) over a 1-D mesh with parallelize_module, in place.

    Each TransformerBlock becomes a HeadParallelBlock with regrouped qkv rows, so that
    ColwiseParallel's contiguous split gives each rank its heads' q, k and v; proj and fc2 are
    RowwiseParallel; its forward takes the local number of heads from qkv's local output.
    With `sequence_parallel`, the norms are SequenceParallel and the residual stream is sharded
    along the sequence (Shard(1)): qkv and fc1 all-gather their input, proj and fc2
    reduce-scatter their output, the embedding (split by vocabulary rows) scatters the sequence
    and the output layer (split by vocabulary columns) gathers it. DTensor sums the gradients
    of the replicated norms over ranks itself. No PrepareModuleInput is needed.
    """
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel as Col
    from torch.distributed.tensor.parallel import RowwiseParallel as Row
    from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

    api = dtensor_api()
    Replicate, Shard = api.Replicate, api.Shard  # noqa: N806

    _checks.module("parallelize_transformer: net", net, sequential=True)
    stage = not sequence_parallel and any(isinstance(u, TransformerBlock) for u in net)
    if not stage and (not len(net) or not isinstance(net[0], nn.Embedding)):
        first = type(net[0]).__name__ if len(net) else "nothing"
        raise TypeError(
            f"parallelize_transformer: net must come from d2l.transformer(...), which starts "
            f"with an Embedding; this one starts with {first}"
        )
    if not isinstance(mesh, DeviceMesh) or mesh.ndim != 1:
        raise TypeError(f"parallelize_transformer: mesh must be a 1-D DeviceMesh, got {mesh!r}")
    world, plan = mesh.size(), {}
    for i, unit in enumerate(net):
        if not isinstance(unit, TransformerBlock):
            continue
        check_heads("parallelize_transformer", unit, world)
        net[i] = HeadParallelBlock(unit, world)
        if sequence_parallel:
            for norm in ("ln1", "ln2"):
                plan[f"{i}.{norm}"] = SequenceParallel()
            for name in ("qkv", "fc1"):
                plan[f"{i}.{name}"] = Col(input_layouts=Shard(1))  # all-gather the sequence
            for name in ("proj", "fc2"):
                plan[f"{i}.{name}"] = Row(output_layouts=Shard(1))  # reduce-scatter it
        else:
            plan |= {f"{i}.qkv": Col(), f"{i}.proj": Row(), f"{i}.fc1": Col(), f"{i}.fc2": Row()}
    if sequence_parallel:
        last = len(net) - 1  # net ends with LayerNorm, Linear
        plan["0"] = Row(input_layouts=Replicate(), output_layouts=Shard(1))
        plan[str(last - 1)] = SequenceParallel()
        plan[str(last)] = Col(input_layouts=Shard(1), output_layouts=Replicate())
    return parallelize_module(net, mesh, plan)


def tp_time_estimate(
    d_model: int,
    tp: int,
    flops_per_s: float,
    link_bytes_per_s: float,
    bytes_per_number: int = 2,
    mfu: float = 0.5,
) -> dict[str, float]:
    """Seconds per token of one block's training step on one of `tp` ranks: arithmetic at `mfu`
    of `flops_per_s`, and the ring all-reduces' bytes over a link of `link_bytes_per_s`.

    The arithmetic: 24 d^2 FLOPs per token forward (qkv 6 d^2, proj 2 d^2, MLP 16 d^2; the T^2
    scores left out), three times that with backward, split over tp ranks. The messages: 4
    all-reduces of one activation (d numbers a token), of which a ring sends 2 (tp - 1) / tp.
    Their ratio does not depend on the number of tokens. Shown in lesson 13.
    """
    _checks.whole("tp_time_estimate: d_model", d_model)
    _checks.whole("tp_time_estimate: tp", tp)
    _checks.whole("tp_time_estimate: bytes_per_number", bytes_per_number, most=16)
    for name, value in (("flops_per_s", flops_per_s), ("link_bytes_per_s", link_bytes_per_s)):
        if not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"tp_time_estimate: {name} must be a positive rate, got {value!r}")
    if not isinstance(mfu, (int, float)) or not 0 < mfu <= 1:
        raise ValueError(f"tp_time_estimate: mfu is a fraction of the peak in (0, 1], got {mfu!r}")
    compute = 3 * 24 * d_model**2 / tp / (flops_per_s * mfu)
    comm = 4 * 2 * (tp - 1) / tp * d_model * bytes_per_number / link_bytes_per_s
    return {"compute_s": compute, "comm_s": comm, "comm_share": comm / (compute + comm)}


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
