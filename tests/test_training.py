"""Timer, measure, Accumulator, accuracy, evaluate_accuracy_gpu and sgd."""

import time

import pytest
import torch
from torch import nn

from d2l_gpu import devices, training


def test_timer_records_and_sums():
    timer = training.Timer()
    time.sleep(0.01)
    t1 = timer.stop()
    timer.start()
    time.sleep(0.02)
    t2 = timer.stop()
    assert t1 >= 0.01 and t2 >= 0.02
    assert timer.sum() == pytest.approx(t1 + t2)
    assert timer.avg() == pytest.approx((t1 + t2) / 2)
    assert timer.cumsum() == pytest.approx([t1, t1 + t2])


def test_timer_synchronizes_its_device(monkeypatch):
    calls = []
    monkeypatch.setattr(training, "synchronize", lambda d: calls.append(d))
    timer = training.Timer("cuda:1")
    timer.stop()
    assert calls == ["cuda:1", "cuda:1"]  # at start and at stop: GPU times are true


def test_measure_is_the_median_after_warmup():
    durations = iter([0.5, 0.0, 0.03, 0.0])  # the warm-up run is slow and must not count
    count = []

    def fn():
        count.append(1)
        time.sleep(next(durations))

    assert training.measure(fn, warmup=1, repeat=3) < 0.1
    assert len(count) == 4
    with pytest.raises(ValueError, match="repeat >= 1"):
        training.measure(fn, repeat=0)


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
