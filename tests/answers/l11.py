"""Lesson 11's exercise checks, each fed a right and a plausible wrong answer."""

from dataclasses import replace

from answers import Answer, Case

NOTEBOOK = "11-sharding.ipynb"
SETUP = ("MiB, GiB = 2**20, 2**30", "returned = []  # what a function")
TODO = "    return ...  # TODO"
GPUS = """    for k in (2**i for i in range(11)):
        if sum(d2l.bytes_per_rank(breakdown, k, {stage}).values()) <= memory:
            return k
    return None
"""
SENT = """    part = (k - 1) / k * P
    return {{0: 2 * part, 1: 2 * part, 2: 2 * part, 3: {stage3} * part}}[stage]
"""
KEPT = "kept_by_every[every] = ..."
SHARD_TODO = "    ...  # TODO: one collective"
RUNS = ("rank_counts = [k for k in", "runs = {}  # number of ranks")
REDUCE_SCATTER = """    shard = torch.empty_like(layer.grad)
    dist.reduce_scatter_tensor(shard, flat_grad)
    layer.grad += shard
    #"""
DIVIDED = """    shard = torch.empty_like(layer.grad)
    dist.reduce_scatter_tensor(shard, flat_grad)
    layer.grad += shard / dist.get_world_size()
    #"""
ALL_REDUCE = """    total = flat_grad.clone()
    dist.all_reduce(total)
    size = layer.shard_size
    layer.grad += total[layer.rank * size : (layer.rank + 1) * size]
    #"""

CASES = [
    Case(
        cell="def gpus_needed(",
        context=SETUP,
        right=Answer(replace=((TODO, GPUS.format(stage="stage")),)),
        wrong=Answer(replace=((TODO, GPUS.format(stage=3)),)),
        why="every stage counted as ZeRO-3",
    ),
    Case(
        cell="def bytes_sent(",
        context=SETUP,
        right=Answer(replace=((TODO, SENT.format(stage3=3)),)),
        wrong=Answer(replace=((TODO, SENT.format(stage3=2)),)),
        why="stage 3 counted like an all-reduce, one gather short",
    ),
    Case(
        cell=KEPT,
        context=SETUP,
        right=Answer(replace=((KEPT, "kept_by_every[every] = {1: 3.0, 2: 1.5, 3: 1.0}[every]"),)),
        wrong=Answer(replace=((KEPT, "kept_by_every[every] = 33.1  # the plain net each time"),)),
        why="the plain net counted each time",
    ),
    Case(
        cell="def keep_gradient_shard(",
        context=SETUP + RUNS,
        right=Answer(replace=((SHARD_TODO, REDUCE_SCATTER),)),
        wrong=Answer(replace=((SHARD_TODO, ALL_REDUCE),)),
        why="the whole gradient all-reduced, then sliced: the right numbers, twice the bytes",
        shared_context=True,  # runs ZeRO 0-3 on 1, 2 and 4 ranks; the check only reads them
    ),
]
# the same check fed a scale error that Adam nearly hides
CASES.append(
    replace(
        CASES[-1],
        wrong=Answer(replace=((SHARD_TODO, DIVIDED),)),
        why="the summed shard divided by k again: gradients 1/k too small, which Adam nearly hides",
    )
)
