"""The workers that `run_workers` starts (lessons 10-12) refuse bad input before any message is
sent, with a sentence naming the value (issue 27). Each is called here as a rank would be, with
no process group, or in a group of one made in this process (no port, no other process)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import d2l_gpu as d2l
from d2l_gpu import distributed

W = d2l.Workload(widths=[8, 16, 4])  # an MLP of 3 units: Linear, ReLU, Linear; batch 64
TP = d2l.Workload(widths=[16, 64, 16, 5])
LENET = d2l.Workload(widths=None)
NAMES = {"torch": torch, "d2l": d2l, "W": W, "TP": TP, "LENET": LENET}

# (the call as a rank makes it, exception type, words the sentence must hold: the argument and
# the value given)
WORKERS = [
    (
        "d2l.pipeline_worker(0, 2, W, [('gpip', 2)])",
        ValueError,
        "schedule must be one of 'gpipe', '1f1b', got 'gpip'",
    ),
    (
        "d2l.pipeline_worker(0, 2, W, [('gpipe', 0)])",
        ValueError,
        "micro-batches of ('gpipe', 0) must be a whole number from 1 to 64, got 0",
    ),
    ("d2l.pipeline_worker(0, 2, W, [('gpipe', 65)])", ValueError, "got 65"),
    (
        "d2l.pipeline_worker(0, 2, W, ('gpipe', 2))",
        ValueError,
        "each of runs is (schedule, micro-batches), e.g. ('gpipe', 4), got 'gpipe'",
    ),
    (
        "d2l.pipeline_worker(0, 4, W, [('gpipe', 2)])",
        ValueError,
        "widths=[8, 16, 4] make an MLP of 3 layers, too few for 4 stages",
    ),
    (
        "d2l.torch_pipeline_worker(0, 2, W, 'GPipe')",
        ValueError,
        "schedule must be one of 'gpipe', '1f1b', got 'GPipe'",
    ),
    (
        "d2l.torch_pipeline_worker(0, 2, W, 'gpipe', 0)",
        ValueError,
        "num_microbatches must be a whole number from 1 to 64, got 0",
    ),
    (
        "d2l.tensor_parallel_worker(0, 3, TP)",
        ValueError,
        "widths=[16, 64, 16, 5] split the hidden widths [64] over 3 ranks",
    ),
    (
        "d2l.tensor_parallel_worker(0, 3, LENET, 'lenet')",
        ValueError,
        "model='lenet' splits 20 and 50 channels over the ranks, which 3 ranks",
    ),
    (
        "d2l.tensor_parallel_worker(2, 2, TP)",
        ValueError,
        "rank must be a whole number from 0 to 1, got 2",
    ),
    (
        "d2l.Workload(widths=W.widths, steps=0)",
        ValueError,
        "steps must be a whole number >= 1, got 0",
    ),
    ("d2l.Workload(widths=[8])", ValueError, "widths must hold at least 2 item(s), got [8]"),
    ("d2l.Workload(widths=W.widths, lr=-1)", ValueError, "lr must be a finite number > 0, got -1"),
    ("d2l.Workload(widths=W.widths, dtype=torch.int64)", TypeError, "dtype must be a floating"),
    ("d2l.Workload(widths=None).data()", ValueError, "this workload has widths=None"),
    ("d2l.fsdp_worker(0, 2, [8, 16, 4])", TypeError, "work must be a d2l.Workload, e.g."),
    ("d2l.tensor_parallel_worker(0, 2, LENET)", ValueError, "work.widths is None"),
    (
        "d2l.torch_tensor_parallel_worker(0, 2, TP)",
        RuntimeError,
        "torch_tensor_parallel_worker needs a process group",
    ),
    ("d2l.zero_worker(0, 0, W, 1)", ValueError, "world must be a whole number >= 1, got 0"),
    ("d2l.zero_worker(0, 2, W, '1')", TypeError, "stage must be a whole number >= 0, got '1'"),
    (
        "d2l.zero_worker(0, 2, W, 1)",
        RuntimeError,
        "zero_worker needs a process group and none is open",
    ),
    ("d2l.zero_stages_worker(0, 2, W, 1)", TypeError, "stages must be a list, got 1"),
    ("d2l.zero_stages_worker(0, 2, W, [0, 5])", ValueError, "ZeRO stage 5 does not exist"),
    ("d2l.fsdp_worker(0, 3, W)", ValueError, "a batch of 64 does not split evenly over 3 ranks"),
    ("d2l.fsdp_worker(0, 0, W)", ValueError, "world must be a whole number >= 1, got 0"),
    (
        "d2l.pingpong_worker(0, 2, [8], 1, (0, 2))",
        ValueError,
        "pair must be two different ranks below 2 (the world size), e.g. (0, 1), got (0, 2)",
    ),
    ("d2l.pingpong_worker(0, 1, [8])", ValueError, "world must be a whole number >= 2, got 1"),
    ("d2l.pingpong_worker(0, 2, [8], 0)", ValueError, "rounds must be a whole number >= 1, got 0"),
    (
        "d2l.pingpong_worker(0, 2, [8], 1, (0, 1), 'min')",
        TypeError,
        "statistic must be a function of a list of seconds, such as min or statistics.median",
    ),
    (
        "d2l.collective_worker(0, 2, [('rign', 2, 64)])",
        ValueError,
        "'ring step', 'server push', 'server pull', got 'rign'",
    ),
    (
        "d2l.collective_worker(0, 2, [('ring', 4, 64)])",
        ValueError,
        "k of ('ring', 4, 64) must be a whole number from 1 to 2, got 4",
    ),
    (
        "d2l.collective_worker(0, 3, [('hierarchical', 3, 64)])",
        ValueError,
        "case ('hierarchical', 3, 64) runs 'hierarchical'",
    ),
    (
        "d2l.overlap_worker(0, 2, [4, 4], [0.1], 8)",
        ValueError,
        "layer_bytes has 2 layers but compute_s has 1 times",
    ),
    (
        "d2l.overlap_worker(0, 2, [4], [-0.1], 8)",
        ValueError,
        "each of compute_s must be a finite number >= 0, got -0.1",
    ),
    ("d2l.check_worker(0, 1)", ValueError, "world must be a whole number >= 2, got 1"),
]


@pytest.mark.parametrize(("call", "kind", "words"), WORKERS, ids=[c[0] for c in WORKERS])
def test_bad_input_is_refused_before_any_message(call, kind, words):
    with pytest.raises(kind) as error:
        eval(call, NAMES)
    assert words in str(error.value)


def test_a_worker_told_the_wrong_world_size_is_refused(group_of_one):
    """A rank that believes in 2 ranks where the group has 1 would wait forever, or sum half."""
    with pytest.raises(ValueError, match=r"rank=0, world=2, but this process is rank 0 of a group"):
        d2l.zero_worker(0, 2, replace(W, steps=1, batch_size=4), 1)


def test_good_input_still_works(group_of_one):
    """The checks do not refuse what the lessons pass (a negative control for the table)."""
    zero = d2l.zero_worker(
        0, 1, replace(W, steps=2, batch_size=4), 3
    )  # one rank, in its group of one
    assert len(zero["losses"]) == 2 and zero["calls"]
    distributed.leave_group()  # a pipeline of one stage needs no group
    runs = d2l.pipeline_worker(0, 1, replace(W, steps=1, batch_size=4), [("gpipe", 4), ("1f1b", 1)])
    assert [len(run["events"]) for run in runs] == [8, 2]
