"""Timer, measure, examples_per_second, Accumulator, accuracy, evaluate_accuracy_gpu and sgd."""

import time
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from d2l_gpu import devices, perf, training


@pytest.fixture
def clock(monkeypatch):
    """The clock that training.Timer reads, moved only by the test: exact, on a busy machine too."""
    now = SimpleNamespace(t=0.0)
    monkeypatch.setattr(training, "time", SimpleNamespace(perf_counter=lambda: now.t))
    return now


def test_timer_records_and_sums(clock):
    timer = training.Timer()
    clock.t += 0.5
    assert timer.stop() == 0.5
    clock.t += 7.0  # between stop and start: not counted
    timer.start()
    clock.t += 0.25
    timer.stop()
    assert timer.times == [0.5, 0.25]
    assert timer.sum() == 0.75 and timer.avg() == 0.375 and timer.cumsum() == [0.5, 0.75]


def test_timer_uses_the_real_clock():
    timer = training.Timer()
    time.sleep(0.01)
    assert timer.stop() >= 0.01


def test_timer_synchronizes_its_device(monkeypatch):
    calls = []
    monkeypatch.setattr(training, "synchronize", lambda d: calls.append(d))
    timer = training.Timer("cuda:1")
    timer.stop()
    assert calls == ["cuda:1", "cuda:1"]  # at start and at stop: GPU times are true


def test_measure_is_the_median_after_warmup(clock):
    durations = iter([100.0, 1.0, 5.0, 2.0])  # the warm-up run is slow and must not count

    def fn():
        clock.t += next(durations)

    # median of 1, 5, 2; timing the warm-up would give 5, the mean 8/3
    assert perf.measure(fn, warmup=1, repeat=3) == 2.0
    with pytest.raises(ValueError, match="repeat >= 1"):
        perf.measure(fn, repeat=0)


class Batches:
    """Four batches of 16 examples; iterating over them takes the next duration on the clock."""

    def __init__(self, clock, durations):
        self.clock, self.durations = clock, iter(durations)
        self.moved = []

    def __iter__(self):
        self.clock.t += next(self.durations)
        for _ in range(4):
            yield Moving(self.moved), torch.zeros(16)


class Moving:
    """A stand-in for X that records the devices it is moved to."""

    def __init__(self, moved):
        self.moved = moved

    def to(self, device, non_blocking=False):
        self.moved.append(device)
        return self


def test_examples_per_second_is_examples_over_median_pass(clock):
    data = Batches(clock, [100.0, 1.0, 4.0, 2.0])  # warm-up, then three timed passes
    assert perf.examples_per_second(data, warmup=1, repeat=3) == 64 / 2.0
    assert data.moved == []  # no device: the batches stay where they are
    data = Batches(clock, [1.0, 0.5])
    assert perf.examples_per_second(data, "meta", warmup=1, repeat=1) == 64 / 0.5
    assert data.moved == ["meta"] * 8  # every batch of both passes, to the device


def test_accumulator():
    metric = training.Accumulator(2)
    metric.add(1, 2)
    metric.add(torch.tensor(3.0), 4)
    assert (metric[0], metric[1]) == (4.0, 6.0)
    metric.reset()
    assert metric.data == [0.0, 0.0]


def test_accuracy_counts_correct_predictions():
    y_hat = torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    assert training.accuracy(y_hat, torch.tensor([1, 0, 0])) == 2.0
    assert training.accuracy(torch.tensor([1, 1]), torch.tensor([1, 0])) == 1.0


def test_evaluate_accuracy_gpu_matches_manual_count_and_leaves_eval_mode():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    data = [(torch.randn(5, 1, 2, 2), torch.randint(0, 3, (5,))) for _ in range(3)]
    expected = sum(training.accuracy(net(X), y) for X, y in data) / 15
    net.train()
    assert training.evaluate_accuracy_gpu(net, data) == pytest.approx(expected)
    assert not net.training  # left in eval mode, like the book's
    assert training.evaluate_accuracy_gpu(net, data, devices.cpu()) == pytest.approx(expected)
    with pytest.raises(ValueError, match="empty data_iter"):
        training.evaluate_accuracy_gpu(net, [])


def test_sgd_step_and_zeroes_grad():
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    (w * torch.tensor([3.0, 4.0])).sum().backward()
    training.sgd([w], lr=0.5, batch_size=2)
    assert torch.allclose(w.detach(), torch.tensor([1 - 0.75, 2 - 1.0]))
    assert torch.count_nonzero(w.grad) == 0
