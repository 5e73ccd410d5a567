"""run_workers: k real processes in one gloo group, results back in rank order, errors named."""

import os

import pytest
import torch
import torch.distributed as dist

from d2l_gpu import distributed


def summed(rank, world_size, base):
    """Every rank contributes rank + base; all_reduce must give every rank the same sum."""
    x = torch.tensor([float(rank + base)])
    dist.all_reduce(x)
    return rank, world_size, x.item(), os.getpid()


def fails(rank, world_size):
    if rank == 1:
        raise ValueError("rank 1 is broken on purpose")
    return rank


def test_results_in_rank_order_from_separate_processes():
    out = distributed.run_workers(summed, 3, 10, timeout=120)
    assert [r[:3] for r in out] == [(r, 3, 33.0) for r in range(3)]  # 10 + 11 + 12
    assert len({r[3] for r in out} | {os.getpid()}) == 4  # three new processes


def test_error_in_one_rank_is_raised_with_its_traceback():
    with pytest.raises(RuntimeError, match="rank 1 of 2 raised:(.|\n)*broken on purpose"):
        distributed.run_workers(fails, 2, timeout=120)


def test_function_from_main_is_refused_with_advice():
    def local(rank, world_size):
        return rank

    local.__module__ = "__main__"
    with pytest.raises(ValueError, match="cannot import it"):
        distributed.run_workers(local, 2)
    with pytest.raises(ValueError, match="at least 1"):
        distributed.run_workers(summed, 0, 0)


def test_backend_is_gloo_without_enough_cuda_devices():
    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has 2+ CUDA devices")
    assert distributed.pick_backend(2) == "gloo"
