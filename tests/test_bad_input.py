"""Public functions refuse bad input at the call, with a sentence naming the value (issue 27)."""

from __future__ import annotations

import pytest
import torch

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


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_refused_with_a_sentence(name):
    call, kind, words = CASES[name]
    with pytest.raises(kind) as error:
        call()
    assert words in str(error.value)


def test_good_input_still_works():
    """The checks do not refuse what the lessons pass (a negative control for the table)."""
    assert d2l.try_gpu(10) in (CPU, d2l.gpu(10))
    assert d2l.scale_for_devices(256, 0.1, 2) == (512, 0.2)
    assert len(d2l.split_batch(X, Y, [CPU, CPU])[0]) == 2
    assert d2l.measure(lambda: None, repeat=1) >= 0
