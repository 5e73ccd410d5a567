"""The argument checks of the workers that `run_workers` starts (lessons 10-12): each refuses
bad input in one sentence before any message is sent.

A worker calls its check first: a rank or size out of range, a width, schedule, stage or case
that cannot work, or a call outside a process group (or with a rank and size that are not the
process's own) is named at once, instead of failing deep inside PyTorch or hanging a collective.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import torch
import torch.distributed as dist

from .. import _checks
from .collectives import TIMED
from .schedules import INTERLEAVED, SCHEDULES
from .workload import Workload

LENET_CHANNELS = (20, 50)  # the output channels of lenet_sequential's two convolutions


def _group(caller: str, rank, world, *, needed: bool = True) -> None:
    """The last check: the process group is open and this process is `rank` of `world`."""
    if needed:
        _checks.in_group(caller, rank, world)


def training(caller: str, rank, world, work, *, widths: bool = True) -> tuple:
    """Rank and size, and `work` a Workload (with widths, unless `widths=False`); its fields."""
    _checks.ranks(caller, rank, world)
    if not isinstance(work, Workload):
        raise TypeError(
            f"{caller}: work must be a d2l.Workload, e.g. d2l.Workload(widths=(16, 64, 5), "
            f"steps=4, batch_size=64, lr=0.1), got {type(work).__name__}"
        )
    if widths and work.widths is None:
        raise ValueError(f"{caller}: work.widths is None; this worker trains an MLP of widths")
    return work.widths, work.steps, work.batch_size


def _stages_fit(caller: str, widths, stages, per: str = "one per rank") -> None:
    """Refuse more pipeline stages than the MLP of `widths` has units (Linear and ReLU layers)."""
    units = 2 * (len(widths) - 1) - 1
    if units < stages:
        raise ValueError(
            f"{caller}: widths={list(widths)} make an MLP of {units} layers, too few for "
            f"{stages} stages ({per}); give more widths, or fewer ranks or stages"
        )


def pipeline(rank, world, work, runs) -> None:
    """pipeline_worker's arguments: runs [(schedule, micro-batches), ...] that fit the batch."""
    widths, steps, batch_size = training("pipeline_worker", rank, world, work)
    _stages_fit("pipeline_worker", widths, world)
    for run in _checks.items("pipeline_worker: runs", runs):
        if not isinstance(run, (tuple, list)) or len(run) != 2:
            raise ValueError(
                f"pipeline_worker: each of runs is (schedule, micro-batches), e.g. ('gpipe', 4), "
                f"got {run!r}"
            )
        _checks.one_of("pipeline_worker: a run's schedule", run[0], SCHEDULES)
        _checks.whole(f"pipeline_worker: micro-batches of {run!r}", run[1], most=batch_size)
    _group("pipeline_worker", rank, world, needed=world > 1)


def torch_pipeline(rank, world, work, schedule, num_microbatches) -> None:
    """torch_pipeline_worker's arguments."""
    widths, steps, batch_size = training("torch_pipeline_worker", rank, world, work)
    _stages_fit("torch_pipeline_worker", widths, world)
    _checks.one_of("torch_pipeline_worker: schedule", schedule, SCHEDULES)
    _checks.whole("torch_pipeline_worker: num_microbatches", num_microbatches, most=batch_size)
    _group("torch_pipeline_worker", rank, world)


def interleaved(rank, world, work, schedule, stages_per_rank, num_microbatches) -> None:
    """interleaved_pipeline_worker's arguments: enough layers for every stage, two stages per
    rank for the V schedule, micro-batches of equal size."""
    caller = "interleaved_pipeline_worker"
    widths, _, batch_size = training(caller, rank, world, work)
    _checks.one_of(f"{caller}: schedule", schedule, tuple(INTERLEAVED))
    _checks.whole(f"{caller}: stages_per_rank", stages_per_rank, least=2)
    if INTERLEAVED[schedule][1] == "v" and stages_per_rank != 2:
        raise ValueError(
            f"{caller}: the V schedule holds exactly 2 stages per rank, not {stages_per_rank}"
        )
    _stages_fit(caller, widths, world * stages_per_rank, f"{stages_per_rank} per rank")
    _checks.whole(f"{caller}: num_microbatches", num_microbatches, most=batch_size)
    if batch_size % num_microbatches:
        raise ValueError(
            f"{caller}: a batch of {batch_size} does not split into {num_microbatches} equal "
            "micro-batches; the mean over micro-batches then differs from the batch's mean"
        )
    _group(caller, rank, world)


def tensor_parallel(rank, world, work, model) -> None:
    """tensor_parallel_worker's arguments: the split layers divide evenly over the ranks."""
    caller = "tensor_parallel_worker"
    if model not in ("mlp", "lenet"):
        raise ValueError(f"model {model!r} is not known; use 'mlp' or 'lenet'")
    widths, _, _ = training(caller, rank, world, work, widths=model == "mlp")
    if model == "mlp":  # each (Linear, ReLU, Linear) pair splits the width between its Linears
        split = list(widths)[1::2][: (len(widths) - 1) // 2]
        if any(w % world for w in split):
            raise ValueError(
                f"{caller}: widths={list(widths)} split the hidden widths {split} over {world} "
                f"ranks, which needs multiples of {world}; change the widths or the ranks"
            )
    elif model == "lenet" and any(c % world for c in LENET_CHANNELS):
        raise ValueError(
            f"{caller}: model='lenet' splits 20 and 50 channels over the ranks, which {world} "
            "ranks cannot do evenly; start 1, 2, 5 or 10 ranks"
        )
    _group(caller, rank, world)


def torch_tensor_parallel(rank, world, work) -> None:
    """torch_tensor_parallel_worker's arguments."""
    training("torch_tensor_parallel_worker", rank, world, work)
    _group("torch_tensor_parallel_worker", rank, world)


def zero(rank, world, work, stage, add_grad=None) -> None:
    """zero_worker's arguments: a ZeRO stage 0-3 and a batch that splits evenly over the ranks;
    `add_grad`, the source text of a function, only for stages 2 and 3."""
    _, _, batch_size = training("zero_worker", rank, world, work)
    zero_stage("zero_worker", stage)
    if add_grad is not None:
        source("zero_worker: add_grad", add_grad, "f(layer, flat_grad)")
        if stage < 2:
            raise ValueError(
                f"zero_worker: add_grad replaces how stages 2 and 3 keep a gradient shard; "
                f"stage {stage} keeps the whole gradient, so run stage 2 or 3 with it"
            )
    even_batch(batch_size, world)
    _group("zero_worker", rank, world)


def zero_stage(caller: str, stage) -> None:
    """Refuse a ZeRO stage other than 0 (plain data parallelism), 1, 2 or 3."""
    _checks.whole(f"{caller}: stage", stage, least=0)
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage {stage} does not exist; use 0 (plain), 1, 2 or 3")


def fsdp(rank, world, work, replicas=1) -> None:
    """fsdp_worker's arguments: a batch that splits evenly over the ranks, and a number of
    replicas that divides them."""
    _, _, batch_size = training("fsdp_worker", rank, world, work)
    _checks.whole("fsdp_worker: replicas", replicas, least=1)
    if world % replicas:
        raise ValueError(
            f"fsdp_worker: {world} ranks do not split into {replicas} equal replicas; "
            f"choose replicas among {[r for r in range(1, world + 1) if world % r == 0]}"
        )
    even_batch(batch_size, world)
    _group("fsdp_worker", rank, world)


def even_batch(batch_size: int, world: int) -> None:
    """Refuse a batch that does not split into equal parts, one per rank."""
    if batch_size % world:
        raise ValueError(f"a batch of {batch_size} does not split evenly over {world} ranks")


def pingpong(rank, world, sizes, rounds, pair, statistic) -> None:
    """pingpong_worker's arguments: two different ranks of the group, sizes in bytes."""
    _checks.ranks("pingpong_worker", rank, world, least=2)
    for n in _checks.items("pingpong_worker: sizes", sizes):
        _checks.whole("pingpong_worker: each of sizes (bytes)", n, least=0)
    _checks.whole("pingpong_worker: rounds", rounds)
    two = isinstance(pair, (tuple, list)) and len(pair) == 2 and pair[0] != pair[1]
    if not two or not all(isinstance(r, int) and 0 <= r < world for r in pair):
        raise ValueError(
            f"pingpong_worker: pair must be two different ranks below {world} (the world size), "
            f"e.g. (0, 1), got {pair!r}"
        )
    if not callable(statistic):
        raise TypeError(
            f"pingpong_worker: statistic must be a function of a list of seconds, such as min or "
            f"statistics.median, got {statistic!r}"
        )
    _group("pingpong_worker", rank, world)


def collective(rank, world, cases, rounds) -> None:
    """collective_worker's arguments: cases (algorithm, k, nbytes[, compute_s]) with k <= world."""
    _checks.ranks("collective_worker", rank, world)
    for case in _checks.items("collective_worker: cases", cases):
        if not isinstance(case, (tuple, list)) or len(case) not in (3, 4):
            raise ValueError(
                "collective_worker: each case is (algorithm, k, nbytes) or (algorithm, k, "
                f"nbytes, compute_s), got {case!r}"
            )
        name, k, nbytes, *compute = case
        _checks.one_of("collective_worker: a case's algorithm", name, TIMED)
        _checks.whole(f"collective_worker: k of {case!r}", k, most=world)
        _checks.whole(f"collective_worker: nbytes of {case!r}", nbytes, least=0)
        for c in compute:
            _checks.number(f"collective_worker: compute_s of {case!r}", c)
        if name in ("hierarchical", "two-level") and k % 2:
            raise ValueError(
                f"collective_worker: case {case!r} runs {name!r} (machines of 2 ranks) on "
                "an odd number of ranks; give it an even k"
            )
    _checks.whole("collective_worker: rounds", rounds)
    _group("collective_worker", rank, world)


def overlap(rank, world, layer_bytes, compute_s, bucket_bytes, rounds) -> None:
    """overlap_worker's arguments: one backward time per layer, sizes and times >= 0."""
    _checks.ranks("overlap_worker", rank, world)
    layer_bytes = _checks.items("overlap_worker: layer_bytes", layer_bytes)
    if len(_checks.items("overlap_worker: compute_s", compute_s)) != len(layer_bytes):
        raise ValueError(
            f"overlap_worker: layer_bytes has {len(layer_bytes)} layers but compute_s has "
            f"{len(compute_s)} times; give one backward time per layer"
        )
    for n, c in zip(layer_bytes, compute_s, strict=True):
        _checks.whole("overlap_worker: each of layer_bytes", n, least=0)
        _checks.number("overlap_worker: each of compute_s", c)
    _checks.whole("overlap_worker: bucket_bytes", bucket_bytes, least=0)
    _checks.whole("overlap_worker: rounds", rounds)
    _group("overlap_worker", rank, world)


def _real_step(caller: str, rank, world, layers, width, batch, folder, rounds) -> None:
    """Arguments of a worker that trains layer_stack: whole sizes, an existing trace folder."""
    _checks.ranks(caller, rank, world)
    for name, value in (("layers", layers), ("width", width), ("batch", batch), ("rounds", rounds)):
        _checks.whole(f"{caller}: {name}", value)
    if folder is not None:
        if not isinstance(folder, (str, Path)):
            raise TypeError(f"{caller}: folder must be a path, got {folder!r}")
        if not Path(folder).is_dir():
            raise FileNotFoundError(
                f"{caller}: the folder {folder} does not exist; create it first"
            )


def backward_overlap(rank, world, layers, width, batch, per_bucket, folder, rounds) -> None:
    """backward_overlap_worker's arguments: whole sizes, an existing folder for the traces."""
    caller = "backward_overlap_worker"
    _real_step(caller, rank, world, layers, width, batch, folder, rounds)
    _checks.whole(f"{caller}: per_bucket", per_bucket)
    if per_bucket > layers:
        raise ValueError(
            f"{caller}: per_bucket {per_bucket} is more than the {layers} layers; "
            "a bucket holds at most all of them"
        )
    _group(caller, rank, world)


def server_steps(rank, world, layers, width, batch, folder, rounds) -> None:
    """server_step_worker's arguments: whole sizes, an existing folder for the traces."""
    _real_step("server_step_worker", rank, world, layers, width, batch, folder, rounds)
    _group("server_step_worker", rank, world)


def source(name: str, text, signature: str) -> None:
    """Refuse anything but the source text of a function (what inspect.getsource returns)."""
    if not isinstance(text, str) or "def " not in text:
        raise TypeError(
            f"{name} must be the source text of a function {signature}, e.g. "
            f"inspect.getsource(f); got {text!r:.60}"
        )


def source_function(text: str, **names):
    """The first function that the source `text` defines, compiled with torch, dist and `names`
    at hand: how a worker runs a function written in a notebook."""
    tree = ast.parse(textwrap.dedent(text))
    name = next(n.name for n in tree.body if isinstance(n, ast.FunctionDef))
    namespace = {"torch": torch, "dist": dist, **names}
    exec(compile(tree, "<the notebook's function>", "exec"), namespace)  # noqa: S102
    return namespace[name]
