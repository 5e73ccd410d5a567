"""Lesson 13's exercise checks, each fed a right and a plausible wrong answer."""

from answers import Answer, Case

NOTEBOOK = "13-transformer-parallel.ipynb"
# the cells the checks read: the imports, then the tensor-parallel run (runs, work) or the MoE
TP = ("import inspect", "work = d2l.TransformerWorkload(", "returned = []  # what a function")
MOE = ("import inspect", "moe = d2l.MoE(", "returned = []  # what a function")
TODO = "    return ...  # TODO"
SP_TODO = "    return ...  # TODO: sequence first, reduce_scatter_tensor into T/k rows, sequence"
SP_TODO += " back"
SP_RIGHT = """    world = dist.get_world_size()
    out = torch.empty((x.shape[1] // world, x.shape[0], *x.shape[2:]), dtype=x.dtype)
    dist.reduce_scatter_tensor(out, x.transpose(0, 1).contiguous())
    return out.transpose(0, 1).contiguous()"""
SP_NO_SUM = "    return x.chunk(dist.get_world_size(), dim=1)[dist.get_rank()].contiguous()"

CASES = [
    Case(
        cell="def tp_bytes(",
        context=TP,
        right=Answer(replace=((TODO, "    return 4 * layers * batch * seq_len * d_model * size"),)),
        wrong=Answer(replace=((TODO, "    return 2 * layers * batch * seq_len * d_model * size"),)),
        why="forward's all-reduces only, backward's forgotten",
    ),
    Case(
        cell="def sp_saving(",
        context=TP,
        right=Answer(replace=((TODO, "    return 1 - (17 / world) / (4 + 13 / world)"),)),
        wrong=Answer(replace=((TODO, "    return 1 - 1 / world"),)),
        why="every activation taken as divided by the ranks",
    ),
    Case(
        cell="def reduce_scatter_seq(",
        context=TP,
        right=Answer(replace=((SP_TODO, SP_RIGHT),)),
        wrong=Answer(replace=((SP_TODO, SP_NO_SUM),)),
        why="each rank keeps its slice of its own partial sum: the ranks' sums never added",
    ),
    Case(
        cell="def dropped(",
        context=MOE,
        right=Answer(
            replace=(("return ...  # TODO", "return sum(max(0, n - capacity) for n in counts)"),)
        ),
        wrong=Answer(
            replace=(("return ...  # TODO", "return max(0, sum(counts) - capacity * len(counts))"),)
        ),
        why="capacity pooled over the experts",
    ),
]
