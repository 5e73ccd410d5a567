"""Data parallelism from scratch (lesson 5): replicas, allreduce, split_batch, train_batch, train.

Device-agnostic: everything is built on ``Tensor.to``, ``copy_`` and ``tensor_split``, so it runs
on CUDA, ROCm, MPS, XPU or the CPU, and on a list that names one device several times.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace

import torch
from torch.nn import functional as F

from .._typed import wrap_public
from ..devices import synchronize
from ..models import lenet, lenet_params
from ..plotting import Animator
from ..training import Timer, sgd

# The functions below are shown verbatim in lesson 5, which calls the helpers the book's way
# (d2l.lenet, d2l.sgd, ...). This namespace gives them those names without importing the package.
d2l = SimpleNamespace(
    Animator=Animator,
    Timer=Timer,
    lenet=lenet,
    lenet_params=lenet_params,
    sgd=sgd,
    synchronize=synchronize,
)


def get_params(params: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Copy `params` to `device` (always a real copy, even on the same device), gradients on."""
    if not isinstance(params, (list, tuple)) or not all(torch.is_tensor(p) for p in params):
        raise TypeError(f"get_params needs a list of tensors, got {type(params).__name__}")
    new_params = [p.detach().to(device, copy=True) for p in params]
    for p in new_params:
        p.requires_grad_()
    return new_params


def allreduce(data: list[torch.Tensor]) -> None:
    """Sum the tensors in `data` (one per device) and put the sum back into every one of them."""
    for i in range(1, len(data)):
        data[0] += data[i].to(data[0].device)
    for i in range(1, len(data)):
        data[i].copy_(data[0])


def reduce_scatter_all_gather(data: list[torch.Tensor]) -> None:
    """Allreduce in two phases: device j sums slice j of every tensor, then all devices copy it."""
    k = len(data)
    slices = [x.view(-1).tensor_split(k) for x in data]
    for j in range(k):  # reduce-scatter: device j owns slice j and sums it
        for i in range(k):
            if i != j:
                slices[j][j].add_(slices[i][j].to(data[j].device))
    for j in range(k):  # all-gather: every other device copies the finished slice j
        for i in range(k):
            if i != j:
                slices[i][j].copy_(slices[j][j])


def flat_grads(device_params: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """Give each replica one flat gradient buffer; every parameter's .grad becomes a view of it."""
    buffers = []
    for params in device_params:
        flat = torch.zeros(sum(p.numel() for p in params), device=params[0].device)
        for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
            if p.grad is not None:
                g.copy_(p.grad.reshape(-1))
            p.grad = g.view_as(p)
        buffers.append(flat)
    return buffers


def split_batch(
    X: torch.Tensor, y: torch.Tensor, devices: list[torch.device]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Split `X` and `y` into one nearly equal shard per device (sizes differ by at most 1)."""
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} examples but y has {y.shape[0]}")
    if X.shape[0] < len(devices):
        raise ValueError(
            f"a batch of {X.shape[0]} examples cannot be split across {len(devices)} devices: "
            "every device needs at least one example (use a larger batch or fewer devices)"
        )
    k = len(devices)
    X_shards = [X_shard.to(d) for X_shard, d in zip(X.tensor_split(k), devices, strict=True)]
    y_shards = [y_shard.to(d) for y_shard, d in zip(y.tensor_split(k), devices, strict=True)]
    return X_shards, y_shards


def train_batch(
    X: torch.Tensor,
    y: torch.Tensor,
    device_params: list[list[torch.Tensor]],
    devices: list[torch.device],
    lr: float,
    grad_buffers: list[torch.Tensor] | None = None,
) -> None:
    """One data-parallel SGD step: shards forward/backward, allreduce the gradients, update all."""
    X_shards, y_shards = split_batch(X, y, devices)
    # The loss is summed (not averaged) on each device; we divide by the whole batch below
    ls = [
        F.cross_entropy(d2l.lenet(X_shard, device_W), y_shard, reduction="sum")
        for X_shard, y_shard, device_W in zip(X_shards, y_shards, device_params, strict=True)
    ]
    for l in ls:  # Backpropagation is performed separately on each device
        l.backward()
    # Sum all gradients from each device and broadcast them to all devices
    with torch.no_grad():
        if grad_buffers is not None:  # one call for the whole model (see flat_grads)
            allreduce(grad_buffers)
        else:  # one call per parameter, as in the book
            for i in range(len(device_params[0])):
                allreduce([device_params[c][i].grad for c in range(len(devices))])
    # The model parameters are updated separately on each device
    for param in device_params:
        d2l.sgd(param, lr, X.shape[0])  # Here, we use a full-size batch


def evaluate_accuracy_parallel(
    device_params: list[list[torch.Tensor]], data_iter: Iterable, devices: list[torch.device]
) -> float:
    """Test accuracy with every batch split across the replicas; only the hit counts are summed."""
    hits = [torch.zeros((), dtype=torch.int64, device=d) for d in devices]
    total = 0
    with torch.no_grad():
        for X, y in data_iter:
            X_shards, y_shards = split_batch(X, y, devices)
            for i, (X_shard, y_shard) in enumerate(zip(X_shards, y_shards, strict=True)):
                y_hat = d2l.lenet(X_shard, device_params[i])
                hits[i] += (y_hat.argmax(dim=1) == y_shard).sum()
            total += y.shape[0]
    if total == 0:
        raise ValueError("evaluate_accuracy_parallel: data_iter gave no examples")
    return sum(h.item() for h in hits) / total


def train_parallel(
    devices: list[torch.device],
    train_iter: Iterable,
    test_iter: Iterable,
    lr: float,
    num_epochs: int,
    *,
    init_scale: float = 0.01,
    seed: int = 0,
    flat: bool = False,
) -> tuple[list[float], float]:
    """Train LeNet data-parallel on `devices`; plot test accuracy; return (accuracies, s/epoch)."""
    if not devices or num_epochs < 1:
        raise ValueError(f"train_parallel needs devices and epochs, got {devices}, {num_epochs}")
    params = d2l.lenet_params(seed, init_scale)
    # Copy model parameters to every device
    device_params = [get_params(params, d) for d in devices]
    grad_buffers = flat_grads(device_params) if flat else None
    animator = d2l.Animator("epoch", "test acc", xlim=[1, num_epochs], ylim=[0, 1])
    timer = d2l.Timer(devices[0])
    for epoch in range(num_epochs):
        timer.start()
        for X, y in train_iter:
            # Perform data-parallel training for a single minibatch
            train_batch(X, y, device_params, devices, lr, grad_buffers)
        for device in devices:  # wait for every device, so the time is true
            d2l.synchronize(device)
        timer.stop()
        # Evaluate with the batches split across the replicas
        animator.add(epoch + 1, (evaluate_accuracy_parallel(device_params, test_iter, devices),))
    animator.show()
    names = ", ".join(str(d) for d in devices)
    print(f"test acc: {animator.Y[0][-1]:.3f}, {timer.avg():.3f} sec/epoch on [{names}]")
    return animator.Y[0], timer.avg()


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
