"""Three-dimensional device meshes: pipeline stages, each of them a 2-D mesh of FSDP2 x tensor
parallelism. Shown in lesson 14.

The world's pp*dp*tp ranks form a ("pp", "dp", "tp") mesh, pp outermost: rank (s, d, t) is
(s * dp + d) * tp + t, so the ranks of one stage are consecutive (one machine, or a few) and
the stages are what crosses the slowest links. Stage s keeps a contiguous run of the model's units
(`stage_units`: the embedding and the first blocks on stage 0, the last blocks, the final norm and
the output layer on the last stage) and splits it as lesson 14's 2-D mesh does: tensor
parallelism over "tp", then `fully_shard` over "dp".

One step is GPipe's schedule with m micro-batches of this dp group's part of the
batch: every forward, then every backward in reverse order. Rank (s, d, t) sends the output of a
micro-batch to (s + 1, d, t), the rank of the next stage with the same tp coordinate, and gets the
gradient of that output back from it. Tensor parallelism's outputs are whole on every tp rank, so
each tp rank sends its own copy (Megatron cuts that traffic by tp with a scatter before the send
and a gather after it). Each micro-batch's loss is its mean divided by m, so the step computes
the gradient of the whole batch's mean, and FSDP adds the micro-batches' reduce-scatters up.

Ran only on gloo CPU processes. On NCCL the pairs call send and recv in the same order (the
forward sends in micro-batch order, the backward's in reverse, each matched by its receive), so
no rank waits for a message its peer has not posted, and a tensor being sent stays referenced
(the saved outputs) until the step ends.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn import functional as F

from .. import _checks
from .._typed import wrap_public
from ..distributed import rank_device, require_torch
from ..gpt import TransformerBlock
from .footprint import CollectiveCounter
from .mesh import held_bytes, predicted_held, split_over_mesh
from .transformer_parallel import full_transformer_parameters
from .workload import TransformerWorkload


def check_layout(caller: str, work: TransformerWorkload, pp, dp, tp, m) -> tuple[int, ...]:
    """pp, dp, tp and m as whole numbers that split the model and the batch, or a ValueError."""
    pp, dp, tp, m = (
        _checks.whole(f"{caller}: {n}", v)
        for n, v in zip("pp dp tp m".split(), (pp, dp, tp, m), strict=True)
    )
    if work.num_layers % pp:
        raise ValueError(
            f"{caller}: {work.num_layers} transformer blocks do not split into pp={pp} stages; "
            "choose pp dividing num_layers"
        )
    if work.batch_size % (dp * m):
        raise ValueError(
            f"{caller}: a batch of {work.batch_size} does not split into dp={dp} parts of m={m} "
            "micro-batches; choose a batch size divisible by dp * m"
        )
    return pp, dp, tp, m


def stage_units(net: nn.Sequential, pp: int, stage: int) -> nn.Sequential:
    """Stage `stage` of `pp` of a d2l.transformer: its share of the blocks, the embedding on the
    first stage, the final norm and output layer on the last."""
    blocks = [i for i, unit in enumerate(net) if isinstance(unit, TransformerBlock)]
    if not 1 <= pp <= len(blocks) or not 0 <= stage < pp:
        raise ValueError(
            f"stage_units: net has {len(blocks)} transformer blocks for pp={pp} stages; stage "
            f"must be 0 to pp - 1 and pp 1 to {len(blocks)}, got stage={stage}, pp={pp}"
        )
    per = len(blocks) // pp
    start = 0 if stage == 0 else blocks[stage * per]
    stop = len(net) if stage == pp - 1 else blocks[(stage + 1) * per]
    return nn.Sequential(*net[start:stop])


def _neighbours(mesh) -> tuple[int | None, int | None]:
    """Global ranks of the previous and next stage's rank with this rank's dp and tp coordinates."""
    ranks = dist.get_process_group_ranks(mesh.get_group("pp"))
    s = mesh.get_local_rank("pp")
    return (ranks[s - 1] if s > 0 else None), (ranks[s + 1] if s + 1 < len(ranks) else None)


def gpipe_step(
    stage: nn.Module,
    mesh: DeviceMesh,
    X: torch.Tensor,
    y: torch.Tensor,
    m: int,
    width: int,
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """Forward and backward of this rank's stage over m micro-batches of (X, y), GPipe's order;
    the sum of the micro-batches' losses on the last stage (each mean / m), else None."""
    prev, nxt = _neighbours(mesh)
    saved, total = [], None
    for Xm, ym in zip(X.tensor_split(m), y.tensor_split(m), strict=True):
        if prev is None:
            h_in = Xm
        else:
            h_in = torch.empty(*Xm.shape, width, dtype=dtype, device=Xm.device)
            dist.recv(h_in, prev)
            h_in.requires_grad_()
        out = stage(h_in)
        if nxt is None:
            out = F.cross_entropy(out.reshape(-1, out.shape[-1]), ym.reshape(-1)) / m
            total = out.detach() if total is None else total + out.detach()
        else:
            dist.send(out.detach(), nxt)
        saved.append((h_in, out))
    for h_in, out in reversed(saved):
        if nxt is None:
            out.backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, nxt)
            out.backward(grad)
        if prev is not None:
            dist.send(h_in.grad, prev)
    return total


def mesh3d_worker(
    rank: int, world: int, work: TransformerWorkload, pp: int, dp: int, tp: int, m: int = 2
) -> dict:
    """Train `work` on a pp x dp x tp mesh: this rank's stage, the losses, the stage's full
    parameters, the bytes of parameters it holds and one step's collectives and messages."""
    _checks.ranks("mesh3d_worker", rank, world)
    _checks.job("mesh3d_worker", work)
    pp, dp, tp, m = check_layout("mesh3d_worker", work, pp, dp, tp, m)
    if pp * dp * tp != world:
        raise ValueError(
            f"mesh3d_worker: pp={pp} x dp={dp} x tp={tp} is {pp * dp * tp}, but world={world}; "
            "choose sizes whose product is the number of processes"
        )
    require_torch(2, 6, "fully_shard (FSDP2) on a CPU")
    from torch.distributed.device_mesh import init_device_mesh

    device = rank_device()
    mesh = init_device_mesh(device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    s = mesh.get_local_rank("pp")
    stage = split_over_mesh(stage_units(work.model(), pp, s).to(device), mesh)
    opt = torch.optim.SGD(stage.parameters(), lr=work.lr)
    X, y = work.data()
    d = mesh.get_local_rank("dp")
    Xp, yp = X.tensor_split(dp)[d].to(device), y.tensor_split(dp)[d].to(device)
    losses, last = [], dist.get_process_group_ranks(mesh.get_group("pp"))[-1]
    for step in range(work.steps):
        opt.zero_grad()
        with CollectiveCounter() as counter:
            loss = gpipe_step(stage, mesh, Xp, yp, m, work.d_model, work.dtype)
        if step == 0:
            calls, nbytes = counter.calls, counter.bytes
        opt.step()
        total = torch.zeros((), dtype=work.dtype, device=device) if loss is None else loss
        dist.all_reduce(total, group=mesh.get_group("dp"))  # the mean over the dp groups' parts
        dist.broadcast(total, last, group=mesh.get_group("pp"))  # from the last stage to all
        losses.append(total.item() / dp)
    return {
        "stage": s,
        "losses": losses,
        "params": full_transformer_parameters(stage),
        "held": held_bytes(stage),
        "calls": calls,
        "bytes": nbytes,
    }


def predict_mesh3d(work: TransformerWorkload, pp: int, dp: int, tp: int, m: int = 2) -> dict:
    """Per stage, the parameter bytes one of its ranks holds ("held"); and the bytes one rank
    sends to the next stage in a step, which are also what comes back ("sent")."""
    pp, dp, tp, m = check_layout("predict_mesh3d", work, pp, dp, tp, m)
    net = work.model()
    held = [predicted_held("predict_mesh3d", stage_units(net, pp, s), dp, tp) for s in range(pp)]
    size = torch.finfo(work.dtype).bits // 8
    sent = work.batch_size // dp * work.seq_len * work.d_model * size  # m micro-batches in all
    return {"held": held, "sent": sent if pp > 1 else 0}


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
