"""Lesson 12's exercise checks, each fed a right and a plausible wrong answer."""

from answers import Answer, Case

NOTEBOOK = "12-synchronisation.ipynb"
SETUP = ("course = Path(d2l.__file__)", "returned = []  # what a function")
MEASURED_LINKS = """
hier = json.loads((course / "benchmarks" / "netns_hierarchy.json").read_text())
inside_link, between_link = AlphaBeta(*hier["inside_model"]), AlphaBeta(*hier["between_model"])
"""
BUCKETS = """    sends, size = [0.0] * len(layer_bytes2), 0
    for i, n in enumerate(layer_bytes2):
        size += n
        if size >= bucket_bytes or i == len(layer_bytes2) - 1:
            sends[i], size = costmodel.{send}, 0
    return costmodel.pipeline_time(compute2, sends)
"""
BOTH_WAYS = """    me, k = dist.get_rank(), len(ranks)
    rings = []  # per half: its chunks, our place in its order, its right and left neighbours
    for half, order in zip(flat_view(x).tensor_split(2), (ranks, ranks[::-1])):
        i = order.index(me)
        rings.append((half.tensor_split(k), i, order[(i + 1) % k], order[(i - 1) % k]))
    for t in range(k - 1):
        incoming = [torch.empty_like(chunks[(i - t - 1) % k]) for chunks, i, _, _ in rings]
        exchange(
            [(chunks[(i - t) % k], right) for chunks, i, right, _ in rings],
            [(buf, left) for buf, (_, _, _, left) in zip(incoming, rings)],
        )
        for buf, (chunks, i, _, _) in zip(incoming, rings):
            chunks[(i - t - 1) % k].add_(buf)
    for t in range(k - 1):
        exchange(
            [(chunks[(i + 1 - t) % k], right) for chunks, i, right, _ in rings],
            [(chunks[(i - t) % k], left) for chunks, i, _, left in rings],
        )  #"""
TWO_THREADS = """    first, second = flat_view(x).tensor_split(2)
    other = threading.Thread(target=collectives.ring_all_reduce, args=(second, ranks[::-1]))
    other.start()
    collectives.ring_all_reduce(first, ranks)
    other.join()  #"""
SPEED_UP = """    between = AlphaBeta(between_link.alpha, beta_between)
    flat = {flat}
    return flat / costmodel.hierarchical_time(inside_link, between, 2**20, 2, 2)  #"""
FLAT = "costmodel.flat_ring_time(inside_link, between, 2**20, 4)"
ACROSS_ONLY = "costmodel.ring_time(between, 2**20, 4)"
BISECT = """low, high = 1e6, 1e12
for _ in range(100):
    mid = (low * high) ** 0.5
    low, high = (mid, high) if speed_up(mid) > 1 else (low, mid)
tie = low"""
TODO = "    return ...  # TODO"  # the rest of the line stays, as a comment


def server_answers(cpu_ms: str) -> Answer:
    return Answer(
        replace=(
            ("gpu0_ms = ...", "gpu0_ms = 175.0"),
            ("cpu_ms = ...", f"cpu_ms = {cpu_ms}"),
            ("ranges_ms = ...", "ranges_ms = 21.875"),
            ("tensors_ms = ...", "tensors_ms = 63.875"),
        )
    )


CASES = [
    Case(
        cell="gpu0_ms = ...",
        context=SETUP,
        right=server_answers("200.0"),
        wrong=server_answers("175.0"),
        why="the CPU counted as one of the 8 GPUs",
    ),
    Case(
        cell="best_bucket = ...",
        context=SETUP,
        right=Answer(
            replace=(
                ("    return ...\n", BUCKETS.format(send="ring_time(link, size, 2)")),
                ("best_bucket = ...", "best_bucket = 2**18"),
            )
        ),
        wrong=Answer(
            replace=(
                ("    return ...\n", BUCKETS.format(send="link.time(size)")),
                ("best_bucket = ...", "best_bucket = 2**18"),
            )
        ),
        why="one message per bucket, not a two-rank ring",
    ),
    Case(
        cell="tie = ...",
        context=SETUP,
        right=Answer(
            code=MEASURED_LINKS,
            replace=((TODO, SPEED_UP.format(flat=FLAT)), ("tie = ...", BISECT)),
        ),
        wrong=Answer(
            code=MEASURED_LINKS,
            replace=((TODO, SPEED_UP.format(flat=ACROSS_ONLY)), ("tie = ...", BISECT)),
        ),
        why="the flat ring timed by the link between machines alone, although its steps wait "
        "for the loopback once that link is fast",
    ),
    Case(
        cell="servers_needed = ...",
        context=SETUP,
        right=Answer(replace=(("servers_needed = ...", "servers_needed = 13"),)),
        wrong=Answer(replace=(("servers_needed = ...", "servers_needed = 12"),)),
        why="a speed-up of 11.97 rounded up to 12",
    ),
    Case(
        cell="def bidirectional_ring_time(",
        context=SETUP,
        right=Answer(replace=((TODO, "    return 2 * (k - 1) * link.time(nbytes / (2 * k))  #"),)),
        wrong=Answer(replace=((TODO, "    return costmodel.ring_time(link, nbytes, k) / 2  #"),)),
        why="half of the whole ring time, latency included",
    ),
    Case(
        cell="def bidirectional_ring(x, ranks)",
        context=SETUP,
        right=Answer(replace=(("    return ...  # TODO", BOTH_WAYS),)),
        wrong=Answer(replace=(("    return ...  # TODO", TWO_THREADS),)),
        why="two ring_all_reduce calls in two threads: right on gloo, not to NCCL's rules",
    ),
]
