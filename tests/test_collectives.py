"""The from-scratch all-reduces of lesson 12 compute what dist.all_reduce computes.

One group of 4 real processes checks every algorithm on the first 2, 3 and 4 ranks, for uneven
sizes (fewer numbers than ranks, primes, a 2-d tensor), exactly for integers and to rounding for
floats; every rank must also end with the same bits as every other.
"""

import pytest
import torch
import torch.distributed as dist
from answers import l12

from d2l_gpu.parallel import collectives
from d2l_gpu.workers import run_workers

SIZES = [1, 2, 3, 5, 7, 64, 1001, (6, 7)]
DTYPES = [torch.int64, torch.float32, torch.float64]


def algorithms(k):
    """Every from-scratch algorithm on the first k ranks, as (name, fn(x, ranks))."""
    out = [
        ("one server", lambda x, r: collectives.ps_push_pull(x, 1, r)),
        ("k servers", lambda x, r: collectives.ps_push_pull(x, len(r), r)),
        ("ring", collectives.ring_all_reduce),
    ]
    if k > 2:
        out.append(("2 servers", lambda x, r: collectives.ps_push_pull(x, 2, r)))
    if k % 2 == 0:
        out.append(("hierarchical", lambda x, r: collectives.hierarchical_all_reduce(x, 2, r)))
        out.append(("two-level", lambda x, r: collectives.two_level_all_reduce(x, 2, r)))
    if k == 4:
        out.append(("hierarchy of 1", lambda x, r: collectives.hierarchical_all_reduce(x, 1, r)))
        out.append(("two-level of 1", lambda x, r: collectives.two_level_all_reduce(x, 1, r)))
        out.append(("two-level of 4", lambda x, r: collectives.two_level_all_reduce(x, 4, r)))
    return out


def data(rank, size, dtype, seed):
    """Rank `rank`'s own tensor: integers of both signs, or floats of mixed magnitudes."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    shape = size if isinstance(size, tuple) else (size,)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g, dtype=torch.float64) * 10 ** (rank - 1)).to(dtype)
    return torch.randint(-(10**12), 10**12, shape, generator=g, dtype=dtype)


def compare(rank, world_size):
    """Each algorithm on ranks 0..k-1, k = 2, 3, 4; return the cases that failed."""
    cases = [(s, torch.int64) for s in SIZES] + [(s, d) for s in (3, 1001) for d in DTYPES[1:]]
    failures = []
    for k in (2, 3, 4):
        ranks = list(range(k))
        group = dist.new_group(ranks)  # every rank must take part in creating it
        if k == 3:  # from here on, gloo's second set of connections (both code paths tested)
            collectives.open_reverse_links()
        if rank >= k:
            continue
        mine = {}
        for seed, (size, dtype) in enumerate(cases):
            expected = data(rank, size, dtype, seed)
            dist.all_reduce(expected, group=group)
            for name, fn in algorithms(k):
                x = data(rank, size, dtype, seed)
                fn(x, ranks)
                if dtype.is_floating_point:
                    tol = 1e-12 if dtype == torch.float64 else 1e-5
                    ok = torch.allclose(x, expected, rtol=tol, atol=tol * 10)
                else:
                    ok = torch.equal(x, expected)
                if not ok:
                    failures.append((k, name, size, str(dtype), "differs from all_reduce"))
                mine[(name, seed)] = x
        everyone = [None] * k
        dist.all_gather_object(everyone, mine, group=group)  # the same bits on every rank?
        for key, x in mine.items():
            if not all(torch.equal(x, other[key]) for other in everyone):
                failures.append((k, *key, "ranks disagree"))
    dist.barrier()
    return failures, bad_inputs(rank) if rank < 2 else []


@pytest.fixture(scope="module")
def results():
    """One group of 4 processes for the whole module: starting processes is the slow part."""
    return run_workers(compare, 4, timeout=240)


def test_every_algorithm_equals_all_reduce_on_2_3_4_ranks(results):
    assert [failures for failures, _ in results] == [[], [], [], []]


def bad_inputs(rank):
    """Ranks 0 and 1 call each algorithm wrongly; each must raise, before any message."""
    errors = []
    for call in (
        lambda: collectives.ring_all_reduce(torch.zeros(4, 4).t()),
        lambda: collectives.hierarchical_all_reduce(torch.zeros(3), 3),
        lambda: collectives.two_level_all_reduce(torch.zeros(3), 3),
        lambda: collectives.ps_push_pull(torch.zeros(3), 5),  # 4 ranks
        lambda: collectives.ring_all_reduce(torch.zeros(3), [1 - rank, 2]),
    ):
        try:
            call()
        except ValueError as e:
            errors.append(str(e))
    return errors


def test_bad_input_is_a_clear_error_not_a_hang(results):
    errors = results[0][1]
    assert len(errors) == 5, errors
    assert "not contiguous" in errors[0]
    assert "local_size=3" in errors[1] and "local_size=3" in errors[2]
    assert "between 1 and 4" in errors[3] and "excludes it" in errors[4]


@pytest.mark.parametrize("numel,servers", [(0, 1), (5, 3), (10, 4), (3, 4)])
def test_key_ranges_cover_every_key_once(numel, servers):
    ranges = collectives.key_ranges(numel, servers)
    assert len(ranges) == servers and ranges[0][0] == 0 and ranges[-1][1] == numel
    assert all(a <= b for a, b in ranges)
    assert all(r[1] == s[0] for r, s in zip(ranges, ranges[1:], strict=False))
    sizes = [b - a for a, b in ranges]
    assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError, match="at least 1"):
        collectives.key_ranges(4, 0)


# --- a student's own all-reduce (lesson 12, exercise 5) ----------------------------------------

# the exercise's right answer and a wrong one (tests/answers/l12.py), as functions
BOTH_WAYS = "def both_ways(x, ranks):\n" + l12.BOTH_WAYS + "\n"
IN_TWO_THREADS = "def in_two_threads(x, ranks):\n" + l12.TWO_THREADS + "\n"
ONE_AFTER_THE_OTHER = """
def one_after_the_other(x, ranks):
    first, second = x.view(-1).tensor_split(2)
    collectives.ring_all_reduce(first, ranks)
    collectives.ring_all_reduce(second, ranks[::-1])
"""
ONE_RING = "def one_ring(x, ranks):\n    collectives.ring_all_reduce(x, ranks)\n"
NOT_ANSWERED = "def starter(x, ranks):\n    return ...\n"


def own_trials(rank, world, sources):
    """own_all_reduce_worker for each source, one after the other, in one process group."""
    from d2l_gpu.parallel.own_collective import own_all_reduce_worker

    # only the wrong answers wait (wait_s): a right one never waits that long
    return [
        own_all_reduce_worker(rank, world, s, nbytes=4096, rounds=1, wait_s=0.5) for s in sources
    ]


def test_a_students_all_reduce_is_checked_counted_by_direction_and_timed():
    """Both ways round, the right answer: exact, half the bytes each way, both ways at once,
    from one thread. Plausible wrong ones differ: two threads (gloo copes, NCCL may not), one
    way after the other (not at once), one ring (every byte to the right); the starter's ... is
    told apart from an answer."""
    sources = [BOTH_WAYS, IN_TWO_THREADS, ONE_AFTER_THE_OTHER, ONE_RING, NOT_ANSWERED]
    both, threads, serial, ring, starter = run_workers(own_trials, 4, sources, backend="gloo")[0]
    assert both["equal"] and both["at_once"] and both["threads"] == 1
    assert all(0.45 < share < 0.55 for share in both["to_right"]), both["to_right"]
    assert set(both["seconds"]) == {"one ring", "both ways"}
    assert threads["equal"] and threads["at_once"] and threads["threads"] == 2
    assert all(0.45 < share < 0.55 for share in threads["to_right"])
    assert serial["equal"] and not serial["at_once"] and serial["threads"] == 1
    assert all(0.45 < share < 0.55 for share in serial["to_right"])
    assert ring["equal"] and not ring["at_once"] and ring["to_right"] == [1.0] * 4
    assert starter is ...


def test_a_students_all_reduce_needs_three_ranks_and_source_text():
    from d2l_gpu.parallel.own_collective import own_all_reduce_worker

    with pytest.raises(ValueError, match="own_all_reduce_worker: world"):
        own_all_reduce_worker(0, 2, BOTH_WAYS)  # with two, both ways share one pair of ranks
    with pytest.raises(TypeError, match=r"source must be the source text of a function f\(x"):
        own_all_reduce_worker(0, 4, print)


def push_and_pull(rank, world_size):
    """What each rank holds after lesson 12's single phases of one server."""
    x = torch.full((5,), float(rank))
    collectives.server_push(x)  # every other rank sends; nobody's x changes
    pushed = x.clone()
    collectives.server_pull(x)  # the first rank's x reaches every rank
    return pushed, x


def test_server_push_and_pull_move_what_one_server_moves():
    out = run_workers(push_and_pull, 3)
    assert [p.tolist() for p, _ in out] == [[float(r)] * 5 for r in range(3)]
    assert [x.tolist() for _, x in out] == [[0.0] * 5] * 3
