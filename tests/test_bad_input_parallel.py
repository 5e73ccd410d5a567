"""The functions of d2l_gpu.parallel refuse bad input at the call, with a sentence naming the
value (issue 27): schedules, splitting, memory, footprint, the cost model, tensor parallelism.
The workers that `run_workers` starts are in test_bad_input_workers.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import d2l_gpu as d2l

CPU = torch.device("cpu")
X, Y = torch.randn(6, 4), torch.randint(0, 3, (6,))
AB = d2l.AlphaBeta(1e-5, 1e9)
BYTES = {"parameters": 100, "gradients": 100, "optimizer state": 200, "activations": 50}


def seq() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def gpipe(p=2, m=2):
    return d2l.gpipe_schedule(p, m)


NAMES = dict(
    torch=torch, d2l=d2l, nn=nn, seq=seq, gpipe=gpipe, X=X, Y=Y, CPU=CPU, AB=AB, BYTES=BYTES
)

# (the call as a student writes it, exception type, words the sentence must hold: the argument
# and the value given)
CASES = [
    # the functions the lessons print (# @save): their checks are part of the lesson's code
    ("d2l.gpipe_schedule(0, 2)", ValueError, "1 <= p, 1 <= m and p*m <= 10**7, got p=0, m=2"),
    ("d2l.one_f_one_b_schedule(2, 0)", ValueError, "1 <= m and p*m <= 10**7, got p=2, m=0"),
    ("d2l.bubble_fraction(0, 4)", ValueError, "p >= 1 stages and m >= 1 micro-batches, got 0, 4"),
    ("d2l.bubble_fraction(2, 0)", ValueError, "got 2, 0"),
    ("d2l.time_ops(lambda: None)", TypeError, "dict of name -> function"),
    ("d2l.kill_worker('123', 1)", ValueError, "a pid and a rank >= 0, got '123', 1"),
    ("d2l.kill_worker(123, -1)", ValueError, "got 123, -1"),
    ("d2l.time_ops({'a': print}, rounds=0)", ValueError, "rounds >= 1 and warmup >= 0, got 0"),
    ("d2l.time_ops({'a': print}, statistic='min')", TypeError, "statistic must be a function"),
    ("d2l.get_params(None, CPU)", TypeError, "a list of tensors, got NoneType"),
    ("d2l.make_step(seq(), None, nn.CrossEntropyLoss(), CPU)", TypeError, "torch.optim optimizer"),
    (
        "d2l.make_step(seq(), torch.optim.SGD(seq().parameters(), 0.1), nn.MSELoss(), CPU, "
        "amp='bf16')",
        TypeError,
        "amp True, False or a dtype: 'bf16'",
    ),
    ("d2l.ColumnParallelLinear(nn.Linear(4, 4), 2, 2)", ValueError, "rank 2 does not exist"),
    ("d2l.RowParallelLinear(nn.Linear(4, 4), -1, 2)", ValueError, "rank -1 does not exist"),
    ("d2l.ShardedLayer(torch.ones(2, 2), torch.ones(2), 4, 0, 2)", ValueError, "got 4, 0"),
    ("d2l.ShardedLayer(torch.ones(2, 2), torch.ones(2), 1, 2, 2)", ValueError, "rank 0-1 exist"),
    (
        "d2l.adam_step(*[torch.zeros(2)] * 4, 0, 0.1)",
        ValueError,
        "counts steps from 1 (its bias correction), got step=0",
    ),
    ("d2l.train_parallel([], [], [], 0.1, 1)", ValueError, "needs devices and epochs, got [], 1"),
    ("d2l.train_parallel([CPU], [], [], 0.1, 0)", ValueError, "got [device(type='cpu')], 0"),
    (
        "d2l.evaluate_accuracy_parallel([d2l.lenet_params()], [], [CPU])",
        ValueError,
        "data_iter gave no examples",
    ),
    ("d2l.data_parallel(nn.Linear(2, 2), [])", ValueError, "devices is empty; give at least one"),
    ("d2l.stage_devices(0)", ValueError, "k must be a whole number >= 1, got 0"),
    ("d2l.stage_devices(2.0)", TypeError, "k must be a whole number >= 1, got 2.0"),
    ("d2l.place_stages([], [])", ValueError, "stages must hold at least 1 item(s), got []"),
    ("d2l.place_stages([seq()], ['gpu7'])", ValueError, "'gpu7' is not a device"),
    (
        "d2l.place_stages([seq()], 'cpu')",
        TypeError,
        "devices must be a list of devices such as [d2l.try_gpu()]",
    ),
    ("d2l.idle_fraction([])", ValueError, "events must hold at least 1 item(s), got []"),
    ("d2l.idle_fraction([(0, 'F', 0, 1.0, 1.0)])", ValueError, "the events span 0.0 s"),
    ("d2l.max_in_flight('gpipe')", TypeError, "schedule must be a list, got 'gpipe'"),
    ("d2l.simulate_schedule([])", ValueError, "schedule must hold at least 1 item(s), got []"),
    (
        "d2l.simulate_schedule(gpipe(), -1)",
        ValueError,
        "t_forward must be a finite number >= 0, got -1",
    ),
    ("d2l.walk_schedule([[('X', 0)]])", ValueError, "schedule[0] holds ('X', 0)"),
    ("d2l.walk_schedule([[('F', 0), ('F', 0), ('B', 0)]])", ValueError, "runs ('F', 0) twice"),
    (
        "d2l.run_schedule([seq()], [CPU], gpipe(), X, Y)",
        ValueError,
        "1 stages, 1 devices and a schedule of 2 stages",
    ),
    ("d2l.run_schedule([seq(), seq()], [CPU], gpipe(), X, Y)", ValueError, "2 stages, 1 devices"),
    (
        "d2l.run_schedule([seq()], [CPU], gpipe(1), X, Y[:4])",
        ValueError,
        "X has 6 examples but y has 4",
    ),
    ("d2l.layer_table(nn.Linear(4, 3), X)", TypeError, "net must be an nn.Sequential, got Linear"),
    (
        "d2l.layer_table(seq(), X[:0])",
        ValueError,
        "X must be a batch of at least one example, got shape (0, 4)",
    ),
    ("d2l.balanced_cuts([1, 2], 1.5)", TypeError, "k must be a whole number >= 1, got 1.5"),
    ("d2l.balanced_cuts([], 1)", ValueError, "costs must hold at least 1 item(s), got []"),
    ("d2l.balanced_cuts([1, -2, 3], 2)", ValueError, "costs must be a finite number >= 0, got -2"),
    ("d2l.balanced_cuts([1, float('nan'), 3], 2)", ValueError, "got nan"),
    ("d2l.split_stages(seq(), 2, [1.0])", ValueError, "costs has 1 values but net has 3 units"),
    ("d2l.split_stages(d2l.LeNet(), 2)", TypeError, "net must be an nn.Sequential, got LeNet"),
    ("d2l.split_costs(seq(), X, 0)", ValueError, "k must be a whole number >= 1, got 0"),
    (
        "d2l.split_costs(seq(), X, 2, 0)",
        ValueError,
        "bytes_per_number must be a whole number >= 1, got 0",
    ),
    ("d2l.bytes_per_rank(BYTES, 0)", ValueError, "k must be a whole number >= 1, got 0"),
    ("d2l.bytes_per_rank(BYTES, 1.5)", TypeError, "k must be a whole number >= 1, got 1.5"),
    ("d2l.bytes_per_rank(BYTES, 2, '1')", TypeError, "stage must be a whole number >= 0, got '1'"),
    (
        "d2l.bytes_per_rank([1, 2], 2)",
        TypeError,
        "breakdown must be the dict d2l.memory_breakdown returns, got [1, 2]",
    ),
    ("d2l.checkpoint_every(seq(), 0)", ValueError, "every must be a whole number >= 1, got 0"),
    ("d2l.checkpoint_every(seq(), -1)", ValueError, "got -1"),
    (
        "d2l.checkpoint_every(nn.Linear(2, 2))",
        TypeError,
        "net must be an nn.Sequential, got Linear",
    ),
    ("d2l.Checkpointed(3)", TypeError, "module must be an nn.Module, got int"),
    ("d2l.MemoryMeter('gpu')", ValueError, "device 'gpu' is not a device PyTorch knows"),
    ("d2l.allocated_bytes('gpu')", ValueError, "device 'gpu' is not a device"),
    (
        "d2l.train_measured(lambda: 1, 0, CPU, [])",
        ValueError,
        "steps must be a whole number >= 1, got 0",
    ),
    (
        "d2l.train_measured(3, 2, CPU, [])",
        TypeError,
        "step must be a function to call (e.g. lambda: ...), got 3",
    ),
    (
        "d2l.step_seconds(lambda: 1, CPU, 0)",
        ValueError,
        "repeat must be a whole number >= 1, got 0",
    ),
    (
        "d2l.step_seconds(lambda: 1, CPU, 1, -1)",
        ValueError,
        "warmup must be a whole number >= 0, got -1",
    ),
    (
        "d2l.train_one_device(seq(), X, Y, 0, 0.1)",
        ValueError,
        "steps must be a whole number >= 1, got 0",
    ),
    ("d2l.train_one_device(seq(), X, Y[:3], 1, 0.1)", ValueError, "X has 6 examples but y has 3"),
    (
        "d2l.AlphaBeta(1e-05, 0)",
        ValueError,
        "beta (bytes per second) must be a finite number > 0, got 0",
    ),
    (
        "d2l.AlphaBeta(-1, 1000000000.0)",
        ValueError,
        "alpha (seconds per message) must be a finite number >= 0, got -1",
    ),
    ("d2l.ps_time(AB, 1000000.0, 0)", ValueError, "k must be a whole number >= 1, got 0"),
    (
        "d2l.ps_time(AB, 1000000.0, 4, 0)",
        ValueError,
        "num_servers must be a whole number from 1 to 4, got 0",
    ),
    (
        "d2l.ps_time((1e-05, 1000000000.0), 1000000.0, 4)",
        TypeError,
        "link must be an AlphaBeta(alpha, beta), got (1e-05, 1000000000.0)",
    ),
    ("d2l.ring_time(AB, 1000000.0, -1)", ValueError, "k must be a whole number >= 1, got -1"),
    ("d2l.ring_time(AB, -1, 4)", ValueError, "nbytes must be a finite number >= 0, got -1"),
    (
        "d2l.hierarchical_time(AB, AB, 1000000.0, 2, 0)",
        ValueError,
        "local_size must be a whole number >= 1, got 0",
    ),
    (
        "d2l.hierarchical_time(AB, AB, 1000000.0, 0, 2)",
        ValueError,
        "machines must be a whole number >= 1, got 0",
    ),
    ("d2l.pipeline_time([1, 2], [1])", ValueError, "compute has 2 times but comm has 1"),
    (
        "d2l.pipeline_time([1, -2], [1, 1])",
        ValueError,
        "each time must be a finite number >= 0, got -2",
    ),
    ("d2l.megatron_mlp(seq(), 0, 0)", ValueError, "world must be a whole number >= 1, got 0"),
    ("d2l.megatron_mlp(seq(), 2, 2)", ValueError, "rank must be a whole number from 0 to 1, got 2"),
    (
        "d2l.megatron_mlp(nn.Linear(2, 2), 0, 2)",
        TypeError,
        "net must be an nn.Sequential, got Linear",
    ),
    (
        "d2l.channel_parallel_convs(d2l.lenet_sequential(), 2, 2)",
        ValueError,
        "rank must be a whole number from 0 to 1, got 2",
    ),
    (
        "d2l.full_parameters(seq())",
        RuntimeError,
        "full_parameters needs a process group and none is open",
    ),
    ("d2l.open_reverse_links()", RuntimeError, "open_reverse_links needs a process group"),
]


@pytest.mark.parametrize(("call", "kind", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_with_a_sentence(call, kind, words):
    with pytest.raises(kind) as error:
        eval(call, NAMES)
    assert words in str(error.value)


def test_good_input_still_works():
    """The checks do not refuse what the lessons pass (a negative control for the tables)."""
    schedule = d2l.one_f_one_b_schedule(2, 3)
    events = d2l.simulate_schedule(schedule, 1.0, 0.0)  # a free backward is allowed
    assert 0 < d2l.idle_fraction(events) < 1 and d2l.max_in_flight(schedule) == [2, 1]
    assert len(list(d2l.walk_schedule(schedule))) == 12
    stages = d2l.place_stages(d2l.split_stages(seq(), 2), d2l.stage_devices(2))
    assert d2l.run_schedule(stages, [CPU, CPU], schedule, X, Y) > 0
    assert d2l.balanced_cuts([0, 1, 2], 2) == [0, 2, 3]  # a unit of zero cost is fine
    assert d2l.split_costs(seq(), X, 3)["layers"]["params"] > 0
    assert d2l.bytes_per_rank(BYTES, 4, 3)["parameters"] == 25
    assert len(d2l.checkpoint_every(seq(), 2)) == 2
    assert d2l.AlphaBeta(0.0, float("inf")).time(10**9) == 0.0
    assert d2l.ps_time(AB, 2**20, 5) > d2l.ps_time(AB, 2**20, 4, 4) > 0
    assert d2l.ring_time(AB, 0, 1) == 0.0 and d2l.pipeline_time([2], [0]) == 2
    assert d2l.hierarchical_time(AB, AB, 1e6, machines=2, local_size=2) > 0
    assert d2l.train_one_device(seq(), X, Y, 1, 0.1, "adam")[0] > 0
    assert d2l.train_measured(lambda: 1, 1, CPU, [])["outputs"] == [1]
    assert d2l.step_seconds(lambda: None, "cpu", repeat=1, warmup=0) >= 0
    with d2l.MemoryMeter("cpu") as meter:
        torch.ones(1000)
    assert meter.peak >= 0


def test_book_style_dataset_refuses_what_is_not_images_and_labels():
    from d2l_gpu.book.dataset import BookStyleDataset

    with pytest.raises(ValueError, match="needs a tensor of images and as many labels"):
        BookStyleDataset(torch.zeros(3, 28, 28, dtype=torch.uint8), torch.zeros(2))
    assert len(BookStyleDataset(torch.zeros(3, 28, 28, dtype=torch.uint8), torch.zeros(3))) == 3
