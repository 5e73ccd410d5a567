"""The book's training functions of the 0.17 era: train_ch6 (one device), train_ch13 (several).

Same signatures, printed lines and plots as the book's; device-agnostic (the devices come from
d2l_gpu.devices, several devices are used through nn.DataParallel only where it applies: two or
more CUDA devices), timed with synchronisation. The fixes are listed in docs/maintaining.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

from .. import _checks
from .._typed import wrap_public
from ..devices import try_all_gpus
from ..models import has_lazy, materialize
from ..plotting import Animator
from ..training import Accumulator, Timer, accuracy, data_parallel, evaluate_accuracy_gpu


def _plot_now(i: int, num_batches: int) -> bool:
    """True at every fifth of an epoch and at its last batch (the book divides by zero < 5)."""
    return (i + 1) % max(1, num_batches // 5) == 0 or i == num_batches - 1


def _xavier(m: nn.Module) -> None:
    if type(m) in (nn.Linear, nn.Conv2d):
        nn.init.xavier_uniform_(m.weight)


def train_ch6(
    net: nn.Module, train_iter: Iterable, test_iter: Iterable, num_epochs: int, lr: float, device
) -> None:
    """Train a model with a GPU (the book's chapter 6 loop): Xavier init, SGD, live plot.

    Lazy layers are given their shapes with the first batch before the Xavier init (the book's
    skips them). The examples/sec figure times whole epochs, data loading included.
    """
    _checks.loop("train_ch6", net, train_iter, num_epochs)
    _checks.device("train_ch6: device", device, available=True)
    if has_lazy(net):
        X, _ = next(iter(train_iter))
        materialize(net, X.shape)
    net.apply(_xavier)
    print("training on", device)
    net.to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    loss = nn.CrossEntropyLoss()
    animator = Animator(
        xlabel="epoch", xlim=[1, num_epochs], legend=["train loss", "train acc", "test acc"]
    )
    timer, num_batches = Timer(device), len(train_iter)
    for epoch in range(num_epochs):
        net.train()
        l_sum = hits = torch.zeros((), device=device)  # summed on the device: no sync per step
        n = 0
        timer.start()
        for i, (X, y) in enumerate(train_iter):
            optimizer.zero_grad()
            X, y = X.to(device), y.to(device)
            y_hat = net(X)
            l = loss(y_hat, y)
            l.backward()
            optimizer.step()
            with torch.no_grad():
                l_sum = l_sum + l * X.shape[0]
                hits = hits + (y_hat.argmax(dim=1) == y).sum()
            n += X.shape[0]
            if _plot_now(i, num_batches):
                train_l, train_acc = l_sum.item() / n, hits.item() / n
                animator.add(epoch + (i + 1) / num_batches, (train_l, train_acc, None))
        timer.stop()
        test_acc = evaluate_accuracy_gpu(net, test_iter)
        animator.add(epoch + 1, (None, None, test_acc))
    print(f"loss {train_l:.3f}, train acc {train_acc:.3f}, test acc {test_acc:.3f}")
    print(f"{n * num_epochs / timer.sum():.1f} examples/sec on {device}")


def train_batch_ch13(
    net: nn.Module,
    X: torch.Tensor | list[torch.Tensor],
    y: torch.Tensor,
    loss: Callable,
    trainer: torch.optim.Optimizer,
    devices: Sequence[torch.device],
) -> tuple[torch.Tensor, float]:
    """Train for a minibatch (X may be a list of tensors); return (summed loss, correct count)."""
    if isinstance(X, list):  # several inputs per example (the book's BERT fine-tuning)
        X = [x.to(devices[0]) for x in X]
    else:
        X = X.to(devices[0])
    y = y.to(devices[0])
    net.train()
    trainer.zero_grad()
    pred = net(X)
    l = loss(pred, y)
    l.sum().backward()
    trainer.step()
    return l.sum().detach(), accuracy(pred, y)


def train_ch13(
    net: nn.Module,
    train_iter: Iterable,
    test_iter: Iterable,
    loss,
    trainer,
    num_epochs: int,
    devices=None,
) -> None:
    """Train a model with multiple GPUs (the book's chapter 13 loop), on any devices.

    `devices` defaults to d2l.try_all_gpus() at call time (the book's is fixed at import).
    """
    _checks.loop("train_ch13", net, train_iter, num_epochs)
    _checks.callable_("train_ch13: loss", loss)
    if not (hasattr(trainer, "zero_grad") and hasattr(trainer, "step")):
        raise TypeError(
            f"train_ch13: trainer must be an optimizer such as torch.optim.SGD(net.parameters(), "
            f"lr=0.1), got {trainer!r}"
        )
    devices = _checks.devices("train_ch13: devices", devices or try_all_gpus(), available=True)
    timer, num_batches = Timer(devices[0]), len(train_iter)
    animator = Animator(
        xlabel="epoch",
        xlim=[1, num_epochs],
        ylim=[0, 1],
        legend=["train loss", "train acc", "test acc"],
    )
    net = data_parallel(net.to(devices[0]), devices)
    for epoch in range(num_epochs):
        # Sums of training loss and correct predictions, no. of examples, no. of predictions
        metric = Accumulator(4)
        for i, (features, labels) in enumerate(train_iter):
            timer.start()
            l, acc = train_batch_ch13(net, features, labels, loss, trainer, devices)
            metric.add(l, acc, labels.shape[0], labels.numel())
            timer.stop()
            if _plot_now(i, num_batches):
                animator.add(
                    epoch + (i + 1) / num_batches,
                    (metric[0] / metric[2], metric[1] / metric[3], None),
                )
        test_acc = evaluate_accuracy_gpu(net, test_iter)
        animator.add(epoch + 1, (None, None, test_acc))
    print(
        f"loss {metric[0] / metric[2]:.3f}, train acc {metric[1] / metric[3]:.3f}, "
        f"test acc {test_acc:.3f}"
    )
    print(f"{metric[2] * num_epochs / timer.sum():.1f} examples/sec on {devices}")


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
