"""Concise training (training, book, perf): DataParallel done right, each option trains."""

import functools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from d2l_gpu import book, models, perf, training

ROOT = Path(__file__).resolve().parent.parent
DATASET = Path("/usr/share/datasets/fashion-mnist")


def small_net() -> nn.Sequential:
    """A tiny lazy conv net (conv, BatchNorm, dense) that trains in milliseconds."""
    return nn.Sequential(
        nn.LazyConv2d(8, kernel_size=3, padding=1),
        nn.LazyBatchNorm2d(),
        nn.ReLU(),
        nn.Flatten(),
        nn.LazyLinear(2),
    )


def toy_data(n=128, batch_size=32, seed=0):
    """Learnable random data: label 1 when the left half of the image is brighter."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 1, 8, 8, generator=g)
    y = (X[..., :4].mean(dim=(1, 2, 3)) > X[..., 4:].mean(dim=(1, 2, 3))).long()
    return [(X[i : i + batch_size], y[i : i + batch_size]) for i in range(0, n, batch_size)]


def book_style_init(record):
    """The book's init_weights, with a recognisable constant instead of N(0, 0.01)."""

    def init(module):
        if type(module) in [nn.Linear, nn.Conv2d]:
            nn.init.constant_(module.weight, 0.125)
            record.append(module)

    return init


def convs(net):
    return [m for m in net.modules() if isinstance(m, nn.Conv2d)]


def test_book_init_skips_lazy_convs_ours_covers_every_one():
    touched = []
    book = models.resnet18()
    book.apply(book_style_init(touched))  # what the book does: before any forward pass
    models.materialize(book)
    initialised = [c for c in convs(book) if bool((c.weight == 0.125).all())]
    assert len(convs(book)) == 20 and len(initialised) == 1  # only the (non-lazy) stem conv
    ours = models.init_every_layer(models.resnet18(), (1, 1, 28, 28), init=book_style_init([]))
    assert all(bool((c.weight == 0.125).all()) for c in convs(ours))


def test_default_init_is_normal_001_on_every_conv():
    torch.manual_seed(0)
    net = models.init_every_layer(models.resnet18(), (1, 1, 28, 28))
    for conv in convs(net):
        assert abs(conv.weight.std().item() - 0.01) < 0.002, conv


def test_scale_for_devices_keeps_per_device_batch():
    assert training.scale_for_devices(256, 0.1, 1) == (256, 0.1)
    batch, lr = training.scale_for_devices(256, 0.1, 2)
    assert batch == 512 and math.isclose(lr, 0.2)
    with pytest.raises(ValueError):
        training.scale_for_devices(256, 0.1, 0)


def test_data_parallel_on_cpu_is_a_working_no_op():
    net = models.materialize(small_net(), (1, 1, 8, 8))
    assert training.data_parallel(net, [torch.device("cpu")]) is net
    if not torch.cuda.is_available():  # nn.DataParallel itself just calls the module here
        X = torch.rand(4, 1, 8, 8)
        net.eval()
        assert torch.equal(nn.DataParallel(net)(X), net(X))


def test_data_parallel_refuses_a_net_not_on_devices0():
    net = nn.Linear(2, 2, device="meta")
    with pytest.raises(ValueError, match="devices\\[0\\]"):
        training.data_parallel(net, [torch.device("cpu")])
    with pytest.raises(ValueError, match="net.to"):  # the book's mistake: net left on the CPU
        training.data_parallel(nn.Linear(2, 2), ["cuda:0", "cuda:1"])


def test_warmup_then_cosine_schedule():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = training.warmup_cosine(opt, total_steps=10, warmup_steps=2, cosine=True)
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:3] == [0.5, 1.0, 1.0] and lrs[-1] < 0.05
    assert all(a >= b for a, b in zip(lrs[1:], lrs[2:], strict=False))


def test_amp_dtype_prefers_bf16():
    assert training.amp_dtype("cpu") == torch.bfloat16


OPTIONS = {
    "plain": {},
    "channels_last": {"channels_last": True},
    "bf16": {"amp": True},
    "fp16_scaler": {"amp": torch.float16},
    "sync_every_step": {"sync_every_step": True},
    "warmup_cosine": {"warmup_steps": 2, "cosine": True},
}


@pytest.mark.parametrize("name", OPTIONS)
def test_each_option_trains_and_reduces_loss(name):
    torch.manual_seed(0)
    data = toy_data()
    r = training.train_concise(
        small_net(), data, data, 4, 0.5, [torch.device("cpu")], shape=(1, 1, 8, 8),
        plot=False, verbose=False, **OPTIONS[name],
    )  # fmt: skip
    assert r["train_losses"][-1] < 0.8 * r["train_losses"][0], r["train_losses"]
    assert r["test_acc"] > 0.6 and r["images_per_sec"] > 0 and len(r["epoch_times"]) == 4


def test_compile_option_trains(monkeypatch):
    eager = functools.partial(torch.compile, backend="eager")  # dynamo without the C++ compiler
    monkeypatch.setattr(torch, "compile", eager)
    torch.manual_seed(0)
    data = toy_data()
    r = training.train_concise(
        small_net(), data, data, 3, 0.5, ["cpu"], shape=(1, 1, 8, 8), compile=True, plot=False,
        verbose=False,
    )  # fmt: skip
    assert r["train_losses"][-1] < r["train_losses"][0]


def test_make_step_returns_device_tensor_without_sync():
    net = models.materialize(small_net(), (1, 1, 8, 8))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    step = training.make_step(net, opt, nn.CrossEntropyLoss(), "cpu", channels_last=True)
    X, y = toy_data()[0]
    l = step(X, y)
    assert isinstance(l, torch.Tensor) and l.ndim == 0 and not l.requires_grad


def test_book_style_dataset_matches_resident_batches():
    images = torch.randint(0, 256, (6, 28, 28), dtype=torch.uint8)
    labels = torch.arange(6)
    ds = book.BookStyleDataset(images, labels)
    X, y = ds[3]
    assert X.shape == (1, 28, 28) and X.dtype == torch.float32 and y == 3
    assert torch.equal(X, images[3].unsqueeze(0).float() / 255)
    assert ds[0][0].shape == (1, 28, 28)
    assert book.BookStyleDataset(images, labels, resize=14)[0][0].shape == (1, 14, 14)


def test_examples_per_second_counts_a_pass():
    data = toy_data(n=64, batch_size=16)
    assert perf.examples_per_second(data, warmup=0, repeat=1) > 0


def test_training_flops_of_a_linear_layer():
    net = nn.Linear(4, 3)
    X, y = torch.rand(5, 4), torch.zeros(5, dtype=torch.long)
    # forward 2*5*4*3; backward: weight gradient only (X needs no gradient) 2*5*4*3
    assert perf.training_flops(net, X, y) == 2 * (2 * 5 * 4 * 3)
    assert net.weight.grad is None  # counted on a copy
    with pytest.raises(ValueError, match="materialize"):
        perf.training_flops(small_net(), torch.rand(1, 1, 8, 8), torch.zeros(1).long())


def test_peak_tflops_unknown_off_cuda():
    assert perf.peak_tflops("cpu") is None


@pytest.mark.slow
@pytest.mark.dataset
@pytest.mark.skipif(not DATASET.is_dir(), reason="needs the Fashion-MNIST files")
def test_benchmark_tiny_mode_writes_valid_json(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_resnet.py"), "--profile", "quick",
           "--steps", "1", "--limit", "128", "--batch-size", "4", "--workers", "1",
           "--threads", "1", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ratio" in proc.stdout and "images/s" in proc.stdout
    result = json.loads(out.read_text())
    assert result["machine"]["torch"] == torch.__version__
    assert result["pipeline"]["examples"] == 128 and result["pipeline"]["ratio"] > 0
    assert [r["path"] for r in result["training"]] == ["book", "d2l_gpu"]
    assert result["flops_per_training_image"] > 1e9  # ResNet-18 at 28x28: about 2.7 GFLOP
