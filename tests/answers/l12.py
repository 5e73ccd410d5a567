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
# links as a live measurement gave them on one machine: the speed-up falls below 1 near 0.8 GB/s
# and rises above it again near 10 GB/s, so a bisection must bracket the first crossing
LIVE_LINKS = """
inside_link, between_link = AlphaBeta(182.0e-6, 2.068e9), AlphaBeta(178.2e-6, 0.013e9)
"""
SCAN = """grid = [10 ** (e / 10) for e in range(30, 151)]
loses = next((i for i, b in enumerate(grid) if speed_up(b) < 1), None)
if loses is None:
    tie = None
else:
    low, high = grid[loses - 1], grid[loses]
    for _ in range(100):
        mid = (low * high) ** 0.5
        low, high = (mid, high) if speed_up(mid) > 1 else (low, mid)
    tie = low"""
TODO = "    return ...  # TODO"  # the rest of the line stays, as a comment


def tie_case(links: str, right: tuple[str, str], wrong: tuple[str, str], why: str) -> Case:
    """Exercise 3 on `links`: answers as (the flat ring's time, the code that finds the tie)."""

    def answer(flat: str, find: str) -> Answer:
        return Answer(code=links, replace=((TODO, SPEED_UP.format(flat=flat)), ("tie = ...", find)))

    return Case("tie = ...", context=SETUP, right=answer(*right), wrong=answer(*wrong), why=why)


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
    tie_case(
        MEASURED_LINKS,
        (FLAT, BISECT),
        (ACROSS_ONLY, BISECT),
        "the flat ring timed by the link between machines alone, although its steps wait "
        "for the loopback once that link is fast",
    ),
    tie_case(
        LIVE_LINKS,
        (FLAT, SCAN),
        (FLAT, BISECT.replace("1e6, 1e12", "1e6, 1e15")),
        "a bisection between two bandwidths where the hierarchy wins, which lands on the "
        "crossing where it starts to win again",
    ),
    tie_case(
        LIVE_LINKS.replace("178.2e-6", "600e-6"),
        (FLAT, SCAN),
        (FLAT, BISECT),
        "a bisection that takes a tie for granted: with 600 us between machines the "
        "hierarchy wins at every bandwidth, and it returns the top of its range",
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
