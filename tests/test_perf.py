"""d2l.HostWaits counts every read of a tensor's value by Python (lesson 3's exercise checks)."""

from __future__ import annotations

import pytest
import torch

import d2l_gpu as d2l
from d2l_gpu.perf import HOST_READS


def originals() -> dict:
    return {name: getattr(torch.Tensor, name) for name in HOST_READS}


def test_each_kind_of_read_counts_once():
    t = torch.tensor([1.5, 2.0])
    with d2l.HostWaits() as waits:
        t[0].item()
        t.tolist()  # reads every value, one wait: counted once
        t.numpy()
        bool(t[0] > 1)
        float(t[0])
        int(t[1])
        [0, 1, 2][torch.tensor(1)]  # a tensor as an index
    assert waits.total == 7
    assert all(waits.counts[name] == 1 for name in HOST_READS)


def test_a_loop_that_reads_each_step_is_told_from_one_that_reads_once():
    V = torch.randn(4, 4)
    with d2l.HostWaits() as each:
        best = float("inf")
        for _ in range(5):
            loss = (V @ V).square().mean()
            if loss < best:
                best = loss.item()
            V = V * 0.5  # a smaller loss every step: the branch reads each time
    with d2l.HostWaits() as once:
        torch.stack([(V @ V).square().mean() for _ in range(5)]).min().item()
    assert each.total == 10 and once.total == 1


def test_the_methods_come_back_after_the_block_even_after_an_error():
    before = originals()
    with pytest.raises(ZeroDivisionError), d2l.HostWaits():
        raise ZeroDivisionError
    assert originals() == before
    with d2l.HostWaits() as waits:
        pass
    torch.ones(1).item()  # outside the block: the negative control, nothing counted
    assert waits.total == 0 and originals() == before


def test_a_counter_counts_one_block_at_a_time():
    waits = d2l.HostWaits()
    with waits, pytest.raises(RuntimeError, match="already counting; make a new one"):
        waits.__enter__()


def test_a_plot_title_names_the_cpu_its_threads_and_load():
    title = d2l.measured_on("a product", [d2l.cpu()])
    assert title.startswith("a product — measured on cpu (") and d2l.cpu_name() in title.replace(
        "\n", " "
    )
    assert f"{torch.get_num_threads()} threads" in title.replace("\n", " ")
    assert all(len(line) <= 70 for line in title.splitlines())


def test_a_plot_title_needs_devices():
    with pytest.raises(ValueError, match="devices must be a non-empty list"):
        d2l.measured_on("a product", [])
