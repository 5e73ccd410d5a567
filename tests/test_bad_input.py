"""Public functions refuse bad input at the call, with a sentence naming the value (issue 27)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import d2l_gpu as d2l

CPU = torch.device("cpu")
X, Y = torch.ones(4, 1), torch.ones(4)

# (call, exception type, words the sentence must hold)
CASES = {
    "try_gpu(-1)": (lambda: d2l.try_gpu(-1), ValueError, "numbered from 0"),
    "try_gpu('x')": (lambda: d2l.try_gpu("x"), TypeError, "whole number"),
    "try_gpu(1.5)": (lambda: d2l.try_gpu(1.5), TypeError, "try_gpu(1.5)"),
    "try_gpu(True)": (lambda: d2l.try_gpu(True), TypeError, "whole number"),
    "gpu(-1)": (lambda: d2l.gpu(-1), ValueError, "gpu(-1)"),
    "split_batch sizes": (lambda: d2l.split_batch(X, Y[:3], [CPU]), ValueError, "4 examples"),
    "resnet18(0)": (lambda: d2l.resnet18(0), ValueError, "num_classes"),
    "resnet18(10, 0)": (lambda: d2l.resnet18(10, 0), ValueError, "in_channels"),
    "resnet18('10')": (lambda: d2l.resnet18("10"), TypeError, "num_classes"),
    "scale_for_devices 0 devices": (
        lambda: d2l.scale_for_devices(256, 0.1, 0),
        ValueError,
        "num_devices",
    ),
    "measure(3)": (lambda: d2l.measure(3), TypeError, "function to call"),
    "load_data batch 0": (lambda: d2l.load_data_fashion_mnist(0), ValueError, "batch_size"),
    "run_workers 0 ranks": (lambda: d2l.run_workers(print, 0), ValueError, "world_size"),
}


def seq() -> nn.Sequential:
    return nn.Sequential(nn.Linear(1, 2), nn.ReLU(), nn.Linear(2, 3))


def with_grad() -> nn.Parameter:
    p = nn.Parameter(torch.ones(2))
    p.grad = torch.ones(2)
    return p


def sgd_for(net) -> torch.optim.Optimizer:
    return torch.optim.SGD(net.parameters(), lr=0.1)


LOSS, BATCHES = nn.CrossEntropyLoss(), [(X, Y.long())]
CONCISE = {"shape": (1, 1), "plot": False, "verbose": False}

# the rest of the package, the book layer included: (the call as a student writes it,
# exception type, words the sentence must hold: the argument and the value given)
MORE = [
    ("d2l.launch('echo hi')", TypeError, "cmd must be a list of arguments"),
    ("d2l.launch([])", ValueError, "cmd must hold at least 1 item(s), got []"),
    ("d2l.run_job(['true'], kill_rank=0, when=True)", TypeError, "when must be a function"),
    ("d2l.launch_and_kill(['true'], -1, lambda o: True)", ValueError, "rank must be a whole"),
    ("d2l.mlp([4, 0, 3])", ValueError, "each of widths must be a whole number >= 1, got 0"),
    ("d2l.mlp(5)", TypeError, "widths must be a list, got 5"),
    ("d2l.TransformerBlock(256, 0)", ValueError, "num_heads must be a whole number >= 1, got 0"),
    ("d2l.transformer(0)", ValueError, "vocab must be a whole number >= 1, got 0"),
    (
        "d2l.resnet_block(64, 0)",
        ValueError,
        "num_residuals must be a whole number from 1 to 1000, got 0",
    ),
    ("d2l.Residual(0)", ValueError, "num_channels must be a whole number >= 1, got 0"),
    ("d2l.lenet_blocks([torch.ones(3)])", ValueError, "params must be the 8 tensors"),
    ("d2l.materialize(seq(), (1, 5))", ValueError, "batch of shape (1, 5) does not fit net"),
    ("d2l.init_every_layer(seq(), (1, 5))", ValueError, "batch of shape (1, 5) does not fit"),
    ("d2l.Accumulator(-1)", ValueError, "n must be a whole number >= 0, got -1"),
    ("d2l.Accumulator(2.5)", TypeError, "n must be a whole number >= 0, got 2.5"),
    ("d2l.Accumulator(2).add(1, 2, 3)", ValueError, "got 3 values for 2 sums"),
    ("d2l.sgd([with_grad()], 0.1, 0)", ValueError, "batch_size must be a finite number > 0, got 0"),
    ("d2l.sgd([nn.Parameter(torch.ones(2))], 0.1, 4)", ValueError, "has no gradient"),
    ("d2l.Timer('gpu')", ValueError, "device 'gpu' is not a device PyTorch knows"),
    ("d2l.synchronize('gpu')", ValueError, "device 'gpu' is not a device PyTorch knows"),
    ("d2l.amp_dtype('gpu')", ValueError, "device 'gpu' is not a device"),
    ("d2l.evaluate_accuracy_gpu(seq(), BATCHES, 'gpu')", ValueError, "device 'gpu' is not"),
    ("d2l.train_concise(seq(), BATCHES, BATCHES, 0, 0.1, **CONCISE)", ValueError, "got 0"),
    ("d2l.train_concise(seq(), BATCHES, BATCHES, 1, 0.1, 'cpu')", TypeError, "got 'cpu'"),
    ("d2l.train_concise(seq(), [], BATCHES, 1, 0.1, **CONCISE)", ValueError, "no batches"),
    ("d2l.peak_tflops('gpu')", ValueError, "device 'gpu' is not a device PyTorch knows"),
    ("d2l.examples_per_second(BATCHES, 'gpu')", ValueError, "device 'gpu' is not a device"),
    ("d2l.measure(lambda: 1, device='gpu')", ValueError, "device 'gpu' is not a device"),
    ("d2l.measure(lambda: 1, repeat=1.5)", TypeError, "repeat must be a whole number, got 1.5"),
    ("d2l.training_flops(seq(), X, Y[:2].long())", ValueError, "X has 4 examples but y has 2"),
    ("d2l.pick_backend(0)", ValueError, "world_size must be a whole number >= 1, got 0"),
    ("d2l.rank_device(-1)", ValueError, "rank must be a whole number >= 0, got -1"),
    ("d2l.toy_data(-1, 4, 3)", ValueError, "n must be a whole number >= 1, got -1"),
    ("d2l.toy_data(4, 4, 0)", ValueError, "num_classes must be a whole number >= 1, got 0"),
    ("d2l.toy_images(2.5)", TypeError, "n must be a whole number >= 1, got 2.5"),
    ("d2l.get_fashion_mnist_labels([10])", ValueError, "labels are 0 to 9, got [10]"),
    ("d2l.get_fashion_mnist_labels([-1])", ValueError, "labels are 0 to 9, got [-1]"),
    ("d2l.add_to_class(3)", TypeError, "Class must be a class such as d2l.Trainer, got 3"),
    ("d2l.Trainer(-1)", ValueError, "max_epochs must be a whole number >= 0, got -1"),
    ("d2l.Trainer(2.5)", TypeError, "max_epochs must be a whole number >= 0, got 2.5"),
    ("d2l.Trainer(1, -1)", ValueError, "num_gpus must be a whole number >= 0, got -1"),
    ("d2l.Trainer(1, 0, -1.0)", ValueError, "gradient_clip_val must be a finite number >= 0"),
    ("d2l.Module(0)", ValueError, "plot_train_per_epoch must be a whole number >= 1, got 0"),
    ("d2l.train_ch6(seq(), BATCHES, BATCHES, 0, 0.1, 'cpu')", ValueError, "num_epochs"),
    ("d2l.train_ch6(seq(), BATCHES, BATCHES, 1, 0.1, 'gpu')", ValueError, "device 'gpu'"),
    ("d2l.train_ch6(seq(), [], BATCHES, 1, 0.1, 'cpu')", ValueError, "no batches"),
    ("d2l.train_ch13(seq(), BATCHES, BATCHES, LOSS, None, 1)", TypeError, "got None"),
    ("d2l.train_ch13(seq(), BATCHES, BATCHES, 3, None, 1)", TypeError, "loss must be a fun"),
    ("d2l.train_ch13(seq(), BATCHES, BATCHES, LOSS, sgd_for(seq()), 0)", ValueError, "got 0"),
    ("d2l.train_ch13(seq(), BATCHES, [], LOSS, sgd_for(seq()), 1, 'cpu')", TypeError, "'cpu'"),
    ("d2l.load_data_book_style(0)", ValueError, "batch_size must be a whole number >= 1, got 0"),
    ("d2l.load_data_book_style(8, (32, 32))", TypeError, "got (32, 32)"),
    ("d2l.load_data_book_style(8, num_workers=-1)", ValueError, "num_workers must be a whole"),
]
# found by the property-based sweep (tests/test_sweep_functions.py, issue 46), kept as cases
MORE += [
    ("d2l.accuracy('logits', torch.ones(2))", TypeError, "accuracy: y_hat must be a torch.Tensor"),
    ("d2l.accuracy(torch.ones(0), torch.ones(3))", ValueError, "got shapes (0,) and (3,)"),
    ("d2l.ring_all_reduce(torch.ones(2))", RuntimeError, "needs a process group and none is"),
    ("d2l.merge(1, 1, 1, 1)", TypeError, "merge: out must be a torch.Tensor, got 1"),
    (
        "d2l.merge(torch.ones(2, 3), torch.ones(2), torch.ones(2, 4), torch.ones(2))",
        ValueError,
        "merge: out and out_b must have one shape",
    ),  # fmt: skip
    ("d2l.AlphaBeta(3, torch.ones(2, 2))", TypeError, "AlphaBeta: beta (bytes per second)"),
    ("d2l.GlobalBatchNorm(-1)", ValueError, "num_features must be a whole number >= 1, got -1"),
    ("d2l.Animator(nrows=0)", ValueError, "Animator: nrows must be a whole number >= 1, got 0"),
    ("d2l.free_port('text')", ValueError, "free_port: host 'text' is no address"),
    ("d2l.get_fashion_mnist_labels(1)", TypeError, "labels must be an iterable"),
    ("d2l.get_fashion_mnist_labels([0.5])", TypeError, "labels must be whole numbers, got 0.5"),
    ("d2l.group_qkv(torch.ones(4, 2), 1)", ValueError, "(a multiple of 3), got shape (4, 2)"),
    ("d2l.load_sharded(nn.Linear(1, 1), 'nowhere', 1)", FileNotFoundError, "save_sharded wrote"),
    ("d2l.plot(nn.Linear(1, 1))", TypeError, "plot: X must be a tensor, an array or a list"),
    ("d2l.show_images([torch.ones(2)], 1, 1)", ValueError, "image 0 is not a picture"),
    ("d2l.TransformerWorkload(text=torch.ones(3))", TypeError, "text must be True or False"),
    ("d2l.examples_per_second([1, 2])", TypeError, "must give (X, y) batches, got 1 as batch 0"),
    ("d2l.sgd('cpu', 0.1, 1)", TypeError, "sgd: params must be the tensors to update"),
    ("d2l.warmup_cosine(1, 10)", TypeError, "optimizer must be a torch.optim.Optimizer, got 1"),
    ("d2l.materialize(nn.Linear(1, 1), torch.ones(2))", TypeError, "shape must be a tuple"),
    ("d2l.ShardedLayer(torch.ones(2, 2), torch.ones(2), 0, 0.1, 2)", TypeError, "rank must be"),
    (
        "d2l.split_over_mesh(nn.Sequential(nn.Linear(1, 1)), 'mesh')",
        TypeError,
        "a torch.DeviceMesh",
    ),
    ("d2l.adam_step(1, 1, 1, 1, 1, 0.1)", TypeError, "adam_step: p must be a torch.Tensor"),
    (
        "d2l.set_axes('axes', None, None, None, None, 'linear', 'linear', [])",
        TypeError,
        "set_axes: axes must be matplotlib's Axes",
    ),  # fmt: skip
    ("d2l.toy_data(2**64, 4, 3)", ValueError, "toy_data: n must fit in PyTorch's int64, got"),
    # found by `make fuzz` (200 examples a function)
    ("d2l.measure(nn.Linear(1, 1))", TypeError, "measure: fn is called with no arguments, but"),
    ("d2l.sgd(nn.Linear(1, 1), 0.1, 1)", TypeError, "sgd: params must be the tensors to update"),
    ("d2l.sgd(['w'], 0.1, 1)", TypeError, "sgd: params must hold tensors, got 'w'"),
    ("d2l.plot([torch.device('cpu')])", TypeError, "plot: Y must hold numbers, but its series 0"),
    (
        "d2l.training_flops(nn.Linear(2, 3), torch.ones(4, 5), torch.zeros(4, dtype=torch.long))",
        ValueError,
        "training_flops: X (4, 5) float32, y (4,) int64 do not fit net",
    ),  # fmt: skip
    (
        "d2l.channel_split(nn.Sequential(nn.Linear(2, 3)), torch.ones(4, 5))",
        ValueError,
        "channel_split: X (4, 5) float32 do not fit net",
    ),  # fmt: skip
    ("d2l.data_parallel(seq(), 'cpu')", TypeError, "data_parallel: devices must be a list"),
    ("d2l.data_parallel(seq(), ['nope'])", ValueError, "devices entry 'nope' is not a device"),
    ("d2l.split_batch(torch.ones(3), torch.ones(3), [])", ValueError, "devices must name at least"),
    ("d2l.stage_backward(torch.ones(2), torch.ones(2), None)", ValueError, "no graph to go back"),
    (
        "d2l.stage_backward(torch.ones(2), torch.ones(2, requires_grad=True) * 2, None)",
        ValueError,
        "stage_backward: out of shape (2,) with no grad: give the loss alone",
    ),  # fmt: skip
    ("d2l.plot(None)", TypeError, "plot: X must be a tensor, an array or a list, got None"),
    ("d2l.plot([])", ValueError, "plot: X is empty or one number"),
    ("d2l.plot([1, 2], yscale='text')", ValueError, "plot: yscale must be one of linear, log"),
    ("d2l.plot([1, 2], fmts=['nope'])", ValueError, "plot: series 0 with format 'nope' cannot be"),
    ("d2l.gpipe_step(seq(), 1, 1, 1, 1, 1, 1)", TypeError, "gpipe_step: mesh must be"),
    ("d2l.train_mesh(seq(), 1, 1, 1, 1, 1)", TypeError, "train_mesh: mesh must be"),
    ("d2l.train_parallel((1, 2), [], [], 0.1, 1)", ValueError, "train_parallel: devices entry 1"),
    ("d2l.stage_forward(seq(), torch.ones(0), 'cpu')", ValueError, "h (0,) float32 do not fit"),
    ("d2l.memory_breakdown(seq(), torch.ones(0))", ValueError, "X (0,) float32 do not fit net"),
    ("d2l.profile_step(seq(), 'trace.json')", TypeError, "profile_step: step is called with no"),
    ("d2l.show_images([], 0, 0)", ValueError, "show_images: num_rows must be a whole number"),
    ("d2l.one_f_one_b_schedule(2**40, 2**40)", ValueError, "p*m <= 10**7, got p=1099511627776"),
    ("d2l.gpipe_schedule(10**4, 10**4)", ValueError, "p*m <= 10**7, got p=10000, m=10000"),
    ("d2l.resnet_block(8, 2**40)", ValueError, "num_residuals must be a whole number from 1 to"),
    ("d2l.step_seconds(seq(), 'cpu')", TypeError, "step_seconds: step is called with no argum"),
    (
        "d2l.train_batch(torch.ones(2, 2), torch.ones(2), torch.ones(2), ['cpu'], 0.1)",
        TypeError,
        "train_batch: device_params must be a list",
    ),  # fmt: skip
]
NAMES = dict(d2l=d2l, torch=torch, nn=nn, seq=seq, with_grad=with_grad, sgd_for=sgd_for)
NAMES.update(X=X, Y=Y, LOSS=LOSS, BATCHES=BATCHES, CONCISE=CONCISE)


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_refused_with_a_sentence(name):
    call, kind, words = CASES[name]
    with pytest.raises(kind) as error:
        call()
    assert words in str(error.value)


@pytest.mark.parametrize(("call", "kind", "words"), MORE, ids=[c[0] for c in MORE])
def test_the_rest_refuses_bad_input_with_a_sentence(call, kind, words):
    with pytest.raises(kind) as error:
        eval(call, NAMES)
    assert words in str(error.value)


def test_good_input_still_works():
    """The checks do not refuse what the lessons pass (a negative control for the table)."""
    assert d2l.try_gpu(10) in (CPU, d2l.gpu(10))
    assert d2l.scale_for_devices(256, 0.1, 2) == (512, 0.2)
    assert len(d2l.split_batch(X, Y, [CPU, CPU])[0]) == 2
    assert d2l.measure(lambda: None, repeat=1) >= 0
    assert d2l.mlp((4, 8, 3))[0].out_features == 8 and len(d2l.transformer(10, 8, 2, 0)) == 3
    assert d2l.Accumulator(0).data == [] and d2l.get_fashion_mnist_labels([9]) == ["ankle boot"]
    assert d2l.Trainer(0, 0, 0).max_epochs == 0 and d2l.pick_backend(1) == "gloo"
    p = with_grad()
    d2l.sgd([p], 0.5, 2)
    assert p.tolist() == [0.75, 0.75] and p.grad.tolist() == [0.0, 0.0]
    assert d2l.toy_data(3, 2, 1)[1].tolist() == [0, 0, 0] and d2l.rank_device(0) == CPU
