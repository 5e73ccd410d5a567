"""Lesson 14's exercise checks, each fed a right and a plausible wrong answer."""

from answers import Answer, Case

NOTEBOOK = "14-long-sequences-meshes.ipynb"
# the cells the checks read: the imports, the job (work) and the ring-attention runs (cp)
SETUP = ("import inspect", "work = d2l.TransformerWorkload(", "returned = []  # what a function")
RING = SETUP[:2] + ("proofs, cp = {}, {}",) + SETUP[2:]
PLAIN = ("import inspect", "returned = []  # what a function")
TODO = "    return ...  # TODO"
RING_BYTES = """    if world == 1:
        return 0
    block = batch * (seq_len // world) * d_model * size
    return layers * ((world - 1) * {backward} + (world - 1) * 2 + 2) * block
"""
HOP = """    rank, world = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty_like(t)
    ops = [
        dist.P2POp(dist.isend, t, (rank {to} 1) % world),
        dist.P2POp(dist.irecv, incoming, (rank {source} 1) % world),
    ]
    return incoming, dist.batch_isend_irecv(ops)"""
PAIRS = """    if layout == "contiguous":
        mine = [(2 * r, 2 * r + 1) for r in range(world)]
    else:
        mine = [(r, 2 * world - 1 - r) for r in range(world)]
    return [sum(q + {diagonal} for q in chunks) for chunks in mine]
"""

CASES = [
    Case(
        cell="def ring_send_bytes(",
        context=RING,
        right=Answer(replace=((TODO, RING_BYTES.format(backward=4)),)),
        wrong=Answer(replace=((TODO, RING_BYTES.format(backward=2)),)),
        why="backward's blocks sent without their gradients",
    ),
    Case(
        cell="def chunk_pairs(",
        context=PLAIN,
        right=Answer(replace=((TODO, PAIRS.format(diagonal=1)),)),
        wrong=Answer(replace=((TODO, PAIRS.format(diagonal=0)),)),
        why="the diagonal chunk pair left out",
    ),
    Case(
        cell="def held(block, rest, dp, tp):",
        context=SETUP,
        right=Answer(replace=((TODO, "    return block // (dp * tp) + rest // dp"),)),
        wrong=Answer(replace=((TODO, "    return (block + rest) // (dp * tp)"),)),
        why="everything split by tensor parallelism too",
    ),
    Case(
        cell="def pass_on(",
        context=SETUP,
        right=Answer(replace=((TODO, HOP.format(to="+", source="-")),)),
        wrong=Answer(replace=((TODO, HOP.format(to="-", source="+")),)),
        why="the ring turned the wrong way: sent to the previous rank, received from the next",
    ),
]
