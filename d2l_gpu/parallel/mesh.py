"""Two-dimensional device meshes: FSDP2 across one mesh dimension, tensor parallelism across the
other, and checkpoints that can be loaded back into a different layout. Shown in lesson 14.

The world's dp*tp ranks are laid out as a dp x tp grid. The ranks of one row (same dp
coordinate) form the "tp" sub-mesh: they split each block's heads and MLP units between them
(ColwiseParallel qkv and fc1, RowwiseParallel proj and fc2) and exchange activations with an
all-reduce after every sub-layer, in forward and backward, so they must see the same tokens.
The ranks of one column (same tp coordinate) form the "dp" sub-mesh: each holds 1/dp of its
TP shard (FSDP2's `fully_shard` per block and at the root), all-gathers a block's parameters
just before use, and reduce-scatters the gradients (averaged over dp) after backward; each dp
group trains on its own part of the batch. TP talks every layer and its messages are
activations, so it goes where links are fastest (inside a node, NVLink); FSDP talks once per
block and can overlap its all-gathers with compute, so it spans nodes.

`save_sharded` writes a distributed checkpoint (torch.distributed.checkpoint): a directory with
each rank's shards and one metadata file saying which slice of which tensor lives where, so a
later job on another layout (or one process) reads just the slices it needs. The TP blocks keep
qkv's rows grouped by rank (transformer_parallel.group_qkv), which depends on tp; the checkpoint
records its tp and `load_sharded` regroups qkv when the tp differs.

FSDP's mixed precision (bfloat16 parameters gathered, float32 gradients reduced) also ran on
gloo CPU: one step's all-gathers move half the bytes of float32, the reduce-scatters the same.

Ran only on gloo CPU processes. On NCCL each rank uses its own GPU (device_type "cuda"), FSDP's
all-gathers and reduce-scatters run on their own streams overlapping compute, and the tp
dimension should map to GPUs of one node.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from .. import _checks
from .._typed import wrap_public
from ..distributed import dtensor_api, rank_device, require_torch
from ..gpt import TransformerBlock
from .footprint import CollectiveCounter
from .transformer_parallel import (
    HeadParallelBlock,
    full_transformer_parameters,
    group_qkv,
    parallelize_transformer,
    ungroup_qkv,
)
from .workload import TransformerWorkload, transformer_loss

TP_DIM = {"qkv.weight": 0, "qkv.bias": 0, "fc1.weight": 0, "fc1.bias": 0}
TP_DIM |= {"proj.weight": 1, "fc2.weight": 1}  # what ColwiseParallel / RowwiseParallel split


def check_mesh(caller: str, world: int, dp, tp) -> tuple[int, int]:
    """dp and tp as whole numbers whose product is the world size, or a ValueError."""
    dp, tp = _checks.whole(f"{caller}: dp", dp), _checks.whole(f"{caller}: tp", tp)
    if dp * tp != world:
        raise ValueError(
            f"{caller}: dp={dp} times tp={tp} is {dp * tp}, but world={world}; choose dp and tp "
            "whose product is the number of processes"
        )
    return dp, tp


def build_mesh_model(work: TransformerWorkload, dp: int, tp: int, param_dtype=None):
    """The 2-D mesh ("dp", "tp") and work.model() split over it by split_over_mesh."""
    from torch.distributed.device_mesh import init_device_mesh

    dp, tp = check_mesh("build_mesh_model", dist.get_world_size(), dp, tp)
    mesh = init_device_mesh(rank_device().type, (dp, tp), mesh_dim_names=("dp", "tp"))
    return mesh, split_over_mesh(work.model().to(rank_device()), mesh, param_dtype)


def split_over_mesh(net: nn.Module, mesh: DeviceMesh, param_dtype=None) -> nn.Module:
    """`net`'s blocks split over mesh["tp"], then each block and the whole sharded over "dp".

    `param_dtype` (e.g. torch.bfloat16): FSDP gathers and computes with parameters in that
    dtype and reduces gradients in float32 (MixedPrecisionPolicy); the shards keep net's dtype.
    """
    require_torch(2, 6, "fully_shard (FSDP2) on a CPU")
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    parallelize_transformer(net, mesh["tp"], False)  # in place
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    options = {"mesh": mesh["dp"]} | ({"mp_policy": policy} if param_dtype else {})
    for unit in net:
        if isinstance(unit, HeadParallelBlock):
            fully_shard(unit, **options)
    return fully_shard(net, **options)


def batch_part(X: torch.Tensor, mesh) -> torch.Tensor:
    """This dp group's part of the batch (every tp rank of the group gets the same part)."""
    return X.tensor_split(mesh["dp"].size())[mesh.get_local_rank("dp")].to(rank_device())


def train_mesh(
    net: nn.Module, mesh: DeviceMesh, X: torch.Tensor, y: torch.Tensor, steps: int, lr: float
) -> list[float]:
    """`steps` SGD steps on this dp group's part of (X, y); the global mean losses."""
    opt, losses = torch.optim.SGD(net.parameters(), lr=lr), []
    Xp, yp = batch_part(X, mesh), batch_part(y, mesh)
    for _ in range(steps):
        opt.zero_grad()
        loss = transformer_loss(net, Xp, yp)
        loss.backward()  # FSDP reduce-scatters the gradients, averaged over dp
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total, group=mesh.get_group("dp"))
        losses.append(total.item() / mesh["dp"].size())
    return losses


def held_bytes(net: nn.Module) -> int:
    """Bytes of the parameter shards this rank holds (each DTensor's local part)."""
    local = (p.to_local() if hasattr(p, "to_local") else p for p in net.parameters())
    return sum(t.numel() * t.element_size() for t in local)


def mesh_worker(rank: int, world: int, work: TransformerWorkload, dp: int, tp: int) -> dict:
    """Train `work` on a dp x tp mesh: losses, full parameters, held bytes, 1 step's collectives."""
    _checks.ranks("mesh_worker", rank, world)
    return mesh_training(work, dp, tp)[1]


def mesh_training(work: TransformerWorkload, dp: int, tp: int) -> tuple[nn.Module, dict]:
    """mesh_worker's run in this process group: the trained split model and the results."""
    dp, tp = check_mesh("mesh_worker", dist.get_world_size(), dp, tp)
    mesh, net = build_mesh_model(work, dp, tp)
    X, y = work.data()
    with CollectiveCounter() as counter:
        losses = train_mesh(net, mesh, X, y, 1, work.lr)
    losses += train_mesh(net, mesh, X, y, work.steps - 1, work.lr)
    return net, {
        "losses": losses,
        "params": full_transformer_parameters(net),
        "held": held_bytes(net),
        "calls": counter.calls,
        "bytes": counter.bytes,
    }


def mesh_save_worker(
    rank: int, world: int, work: TransformerWorkload, dp: int, tp: int, path: str
) -> dict:
    """mesh_worker, then the trained model written to the new checkpoint directory `path`."""
    _checks.ranks("mesh_save_worker", rank, world)
    target = Path(path)
    if target.exists() or not target.parent.is_dir():
        raise ValueError(
            f"mesh_save_worker: the checkpoint directory {path} must not exist yet and its "
            "folder must; pick a new name in an existing folder"
        )  # checked before any training, on every rank
    net, out = mesh_training(work, dp, tp)
    save_sharded(net, path, tp)
    return out


def mesh_resume_worker(
    rank: int, world: int, work: TransformerWorkload, dp: int, tp: int, path: str, steps: int
) -> dict:
    """Read the checkpoint `path` into a fresh dp x tp mesh model and train `steps` more: the
    full parameters as read (`loaded`) and after training (`params`), and the losses."""
    _checks.ranks("mesh_resume_worker", rank, world)
    _checks.whole("mesh_resume_worker: steps", steps)
    if not (Path(path) / ".metadata").is_file():
        raise ValueError(
            f"mesh_resume_worker: {path} holds no distributed checkpoint (no .metadata file); "
            "give the directory mesh_save_worker wrote"
        )
    dp, tp = check_mesh("mesh_resume_worker", dist.get_world_size(), dp, tp)
    mesh, net = build_mesh_model(work, dp, tp)
    load_sharded(net, path, tp)
    loaded = [p.detach().clone() for p in full_transformer_parameters(net)]
    X, y = work.data()
    losses = train_mesh(net, mesh, X, y, steps, work.lr)
    return {"loaded": loaded, "losses": losses, "params": full_transformer_parameters(net)}


def step_collectives_worker(
    rank: int, world: int, work: TransformerWorkload, dp: int, tp: int, param_dtype=None
) -> dict:
    """`step_collectives` as a worker of run_workers (lesson 14's mixed-precision comparison)."""
    _checks.ranks("step_collectives_worker", rank, world)
    return step_collectives(work, dp, tp, param_dtype)


def step_collectives(work: TransformerWorkload, dp: int, tp: int, param_dtype=None) -> dict:
    """The collectives (calls, bytes) of one training step on a fresh dp x tp mesh model."""
    mesh, net = build_mesh_model(work, dp, tp, param_dtype)
    X, y = work.data()
    with CollectiveCounter() as counter:
        train_mesh(net, mesh, X, y, 1, work.lr)
    return {"calls": counter.calls, "bytes": counter.bytes}


def predict_mesh(work: TransformerWorkload, dp: int, tp: int) -> dict:
    """Predicted per-rank held parameter bytes: TP's split of each block tensor, then 1/dp of it;
    and one step's reduce-scatter bytes (CollectiveCounter counts the whole gradient of the TP
    shard a rank reduces: dp x held).

    Assumes every split dimension divides evenly (checked); the embedding, norms and output
    layer are not split by TP (replicated over tp), only sharded over dp.
    """
    dp, tp = check_mesh("predict_mesh", dp * tp, dp, tp)
    held = predicted_held("predict_mesh", work.model(), dp, tp)
    # FSDP calls no reduce-scatter on a dp mesh of one rank (nothing to reduce)
    return {"held": held, "reduce_scatter": held * dp if dp > 1 else 0}


def predicted_held(caller: str, units, dp: int, tp: int) -> int:
    """Parameter bytes one rank holds of `units` (a d2l.transformer or a run of its units): each
    block's split layers divided by tp, then everything by dp; a ValueError where one does not
    divide evenly."""
    held = 0
    for unit in units:
        for name, p in unit.named_parameters():
            shape = list(p.shape)
            if name in TP_DIM and isinstance(unit, TransformerBlock):
                if shape[TP_DIM[name]] % tp:
                    raise ValueError(f"{caller}: {name} {tuple(p.shape)} does not split by tp")
                shape[TP_DIM[name]] //= tp
            if shape[0] % dp:
                raise ValueError(f"{caller}: {name} {tuple(p.shape)} does not split by dp")
            held += math.prod(shape) // dp * p.element_size()
    return held


def save_sharded(net: nn.Module, path: str, tp: int) -> None:
    """Write net's state with torch.distributed.checkpoint: each rank's shards and a metadata file
    in the directory `path`, plus the tp size (qkv's row grouping)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    _checks.module("save_sharded: net", net)
    state = {"model": get_model_state_dict(net), "tp": torch.tensor(tp)}
    dcp.save(state, checkpoint_id=path)


def load_sharded(net: nn.Module, path: str, tp: int) -> None:
    """Read a checkpoint of save_sharded into net (any layout: mesh or one process), in place."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    _checks.module("load_sharded: net", net)
    if not (Path(path) / ".metadata").is_file():  # what torch.distributed.checkpoint writes
        raise FileNotFoundError(f"load_sharded: {path} is not a folder that save_sharded wrote")
    state = {"model": get_model_state_dict(net), "tp": torch.tensor(0)}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(net, state["model"])
    saved = int(state["tp"])
    if saved == tp:
        return
    with torch.no_grad():  # the rows were grouped for `saved` ranks: regroup them for `tp`
        for name, p in net.named_parameters():
            if ".qkv." not in name:
                continue
            full = p.full_tensor() if hasattr(p, "full_tensor") else p.detach()
            fixed = group_qkv(ungroup_qkv(full, saved), tp)
            if hasattr(p, "full_tensor"):
                fixed = (
                    dtensor_api().distribute_tensor(fixed, p.device_mesh, p.placements).to_local()
                )
                p.to_local().copy_(fixed)
            else:
                p.copy_(fixed)


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
