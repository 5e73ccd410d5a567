"""The from-scratch all-reduces of lesson 12 compute what dist.all_reduce computes.

One group of 4 real processes checks every algorithm on the first 2, 3 and 4 ranks, for uneven
sizes (fewer numbers than ranks, primes, a 2-d tensor), exactly for integers and to rounding for
floats; every rank must also end with the same bits as every other.
"""

import pytest
import torch
import torch.distributed as dist

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
