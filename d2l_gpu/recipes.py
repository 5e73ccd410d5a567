"""Concise training: nn.DataParallel used correctly, the options that make one GPU fast, and
the book's input pipeline as a baseline to measure them against."""

from __future__ import annotations

import copy
import math
import statistics

import numpy as np
import torch
from PIL import Image  # a dependency of matplotlib
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .data import read_fashion_mnist
from .devices import try_all_gpus
from .models import has_lazy, init_weights, materialize
from .plotting import Animator
from .training import Timer, evaluate_accuracy_gpu, measure

# Dense (no sparsity) peak TFLOP/s, NVIDIA data sheets: (bf16 or fp16 tensor, fp32 non-tensor).
# Matched in order against torch.cuda.get_device_name(); a GPU not listed gets no fraction of peak.
PEAK_TFLOPS = [
    ("H100 PCIe", 756.0, 51.2),
    ("H100 NVL", 835.0, 60.0),
    ("H100", 989.4, 66.9),
    ("H200", 989.4, 66.9),
    ("A100", 312.0, 19.5),
    ("L40S", 362.0, 91.6),
    ("L40", 181.0, 90.5),
    ("L4", 121.0, 30.3),
    ("V100", 125.0, 15.7),  # fp16 only: V100 has no bf16
    ("T4", 65.0, 8.1),  # fp16 only
]


def scale_for_devices(batch_size: int, lr: float, num_devices: int) -> tuple[int, float]:
    """Global batch and lr for `num_devices`: per-device batch constant, lr scaled linearly."""
    if num_devices < 1:
        raise ValueError(f"num_devices must be at least 1, got {num_devices}")
    return batch_size * num_devices, lr * num_devices


def data_parallel(net: nn.Module, devices) -> nn.Module:
    """nn.DataParallel over 2+ CUDA devices in `devices` (net on devices[0] first), else net."""
    first = torch.device(devices[0])
    where = {p.device for p in net.parameters()}
    if where != {first} and not (first.index is None and {d.type for d in where} == {first.type}):
        raise ValueError(
            f"the parameters of net are on {sorted(map(str, where))}, not on devices[0]={first}: "
            "nn.DataParallel needs them there; call net.to(devices[0]) first"
        )
    ids = [torch.device(d) for d in devices if torch.device(d).type == "cuda"]
    if len(ids) < 2:  # nothing to split: DataParallel would just call net (knows only CUDA)
        return net
    return nn.DataParallel(net, device_ids=ids)


def amp_dtype(device) -> torch.dtype:
    """bf16 where the device computes in it, else fp16 (which needs a GradScaler)."""
    kind = torch.device(device).type
    if kind == "cuda":
        # NVIDIA: bf16 from Ampere (8.x) on; ROCm builds report the AMD arch (9+), all with bf16
        native = torch.cuda.get_device_capability(device)[0] >= 8
        return torch.bfloat16 if native else torch.float16
    return torch.float16 if kind == "mps" else torch.bfloat16


def make_step(net, optimizer, loss, device, *, channels_last=False, amp=False, scheduler=None):
    """Return step(X, y) -> loss as a device tensor (no host sync): one optimizer update."""
    device = torch.device(device)
    dtype = (amp_dtype(device) if amp is True else amp) or None
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
    fmt = torch.channels_last if channels_last else torch.contiguous_format

    def step(X, y):
        X = X.to(device, non_blocking=True).contiguous(memory_format=fmt)
        y = y.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            l = loss(net(X), y)
        if scaler is not None:
            scaler.scale(l).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            l.backward()
            optimizer.step()
        if scheduler is not None:
            scheduler.step()
        return l.detach()

    return step


def warmup_cosine(optimizer, total_steps: int, warmup_steps: int = 0, cosine: bool = False):
    """LambdaLR: linear warm-up over `warmup_steps`, then constant or cosine decay to zero."""

    def factor(i):
        if i < warmup_steps:
            return (i + 1) / warmup_steps
        if not cosine:
            return 1.0
        done = (i - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, done)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def train_concise(
    net,
    train_iter,
    test_iter,
    num_epochs,
    lr,
    devices=None,
    *,
    shape=(1, 1, 28, 28),
    channels_last=False,
    amp=False,
    sync_every_step=False,
    compile=False,
    warmup_steps=0,
    cosine=False,
    init=init_weights,
    plot=True,
    verbose=True,
) -> dict:
    """Train `net` with nn.DataParallel on `devices`; return test acc, median s/epoch, images/s."""
    devices = [torch.device(d) for d in (devices or try_all_gpus())]
    if compile and len(devices) > 1:
        raise ValueError("compile=True needs a single device; for several, use DDP (lesson 7)")
    net.to(devices[0])  # nn.DataParallel requires the module on devices[0]
    materialize(net, shape, devices[0])  # lazy layers get their shapes before anything else
    if init is not None:
        net.apply(init)  # every conv, lazy ones included
    if channels_last:
        net.to(memory_format=torch.channels_last)
    model = data_parallel(torch.compile(net) if compile else net, devices)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    scheduler = warmup_cosine(optimizer, num_epochs * len(train_iter), warmup_steps, cosine)
    step = make_step(
        model,
        optimizer,
        nn.CrossEntropyLoss(),
        devices[0],
        channels_last=channels_last,
        amp=amp,
        scheduler=scheduler,
    )
    legend = ["train loss", "test acc"]
    animator = Animator(xlabel="epoch", xlim=[1, num_epochs], legend=legend) if plot else None
    timer, n, accs, losses = Timer(devices[0]), 0, [], []
    for epoch in range(num_epochs):
        model.train()
        total, seen = 0.0, 0
        timer.start()
        for X, y in train_iter:
            l = step(X, y) * len(y)
            total = total + (l.item() if sync_every_step else l)  # .item() waits for the GPU
            seen += len(y)
        losses.append(float(total) / seen)
        timer.stop()
        n += seen
        accs.append(evaluate_accuracy_gpu(model, test_iter, devices[0]))
        if animator is not None:
            animator.add(epoch + 1, (losses[-1], accs[-1]))
    if animator is not None:
        animator.show()
    result = {
        "test_acc": accs[-1],
        "train_loss": losses[-1],
        "sec_per_epoch": statistics.median(timer.times),  # not skewed by a compiling epoch
        "images_per_sec": n / num_epochs / statistics.median(timer.times),
        "epoch_times": timer.times,
        "test_accs": accs,
        "train_losses": losses,
        "devices": [str(d) for d in devices],
    }
    if verbose:
        secs = result["sec_per_epoch"]
        print(f"test acc: {accs[-1]:.2f}, {secs:.1f} sec/epoch on {result['devices']}")
    return result


class BookStyleDataset(torch.utils.data.Dataset):
    """Fashion-MNIST read the book's way: each image converted on its own as it is fetched."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, resize=None):
        self.images, self.labels, self.resize = images.numpy(), labels.numpy(), resize

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):

        img = Image.fromarray(self.images[i], mode="L")  # like torchvision's FashionMNIST
        if self.resize is not None:
            img = img.resize((self.resize, self.resize), Image.BILINEAR)
        X = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255).unsqueeze(0)  # ToTensor
        return X, int(self.labels[i])


def load_data_book_style(batch_size, resize=None, *, root=None, limit=None, num_workers=4):
    """(train_iter, test_iter) as in the book: per-sample Dataset, DataLoader with workers."""
    raw = read_fashion_mnist(root)
    n = slice(None, limit)
    sets = [
        BookStyleDataset(raw[f"{s}_images"][n], raw[f"{s}_labels"][n], resize)
        for s in ("train", "test")
    ]
    return tuple(
        torch.utils.data.DataLoader(d, batch_size, shuffle=shuffle, num_workers=num_workers)
        for d, shuffle in zip(sets, (True, False), strict=True)
    )


def examples_per_second(data_iter, device=None, *, warmup=1, repeat=3) -> float:
    """Examples per second of a pass over `data_iter`, each batch moved to `device` (median)."""
    counts = []

    def one_pass():
        n = 0
        for X, y in data_iter:
            if device is not None:
                X, y = X.to(device, non_blocking=True), y.to(device, non_blocking=True)
            n += len(y)
        counts.append(n)

    secs = measure(one_pass, device=device, warmup=warmup, repeat=repeat)
    return counts[-1] / secs


def training_flops(net: nn.Module, X: torch.Tensor, y: torch.Tensor) -> int:
    """FLOPs of one forward and backward pass of `net` on (X, y), counted on shapes alone."""
    if has_lazy(net):
        raise ValueError("net has lazy layers: call d2l.materialize(net, shape) first")
    net = copy.deepcopy(net).to("meta")  # no arithmetic done, net itself untouched
    X, y = torch.empty_like(X, device="meta"), torch.empty_like(y, device="meta")
    counter = FlopCounterMode(display=False)
    with counter:
        nn.functional.cross_entropy(net(X), y).backward()
    return counter.get_total_flops()


def peak_tflops(device, low_precision: bool = True) -> float | None:
    """Data-sheet dense peak TFLOP/s of a known CUDA `device` (bf16/fp16 or fp32), else None."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, low, fp32 in PEAK_TFLOPS:
        if key in name:
            return low if low_precision else fp32
    return None
