"""Concise training (training, book, perf): DataParallel done right, each option trains."""

import functools
import json
import math
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from d2l_gpu import models, perf, recipe, training
from d2l_gpu.book import dataset as book

ROOT = Path(__file__).resolve().parent.parent
DATASET = Path("/usr/share/datasets/fashion-mnist")

# "It learns" thresholds for train_toy (chance: accuracy 0.5). Measured by
# `python benchmarks/learning_spread.py` (10 seeds x every option of OPTIONS and compile, each with
# OMP_NUM_THREADS=1 and the default 2 threads: 140 runs; AMD EPYC, torch 2.13.0, 2026-11-22):
# final test accuracy 0.984-1.000 (spread 0.016); last/first epoch loss 0.002-0.062 (spread
# 0.060). Each threshold keeps more than twice the spread from the worst run:
# 0.984 - 0.9 = 0.084 > 2 x 0.016; 0.3 - 0.062 = 0.238 > 2 x 0.060. docs/maintaining.md: the table.
MIN_ACC = 0.9
MAX_LOSS_RATIO = 0.3
LR, EPOCHS = 0.1, 4


def small_net() -> nn.Sequential:
    """A tiny lazy conv net (conv, BatchNorm, dense) that trains in milliseconds."""
    return nn.Sequential(
        nn.LazyConv2d(8, kernel_size=3, padding=1),
        nn.LazyBatchNorm2d(),
        nn.ReLU(),
        nn.Flatten(),
        nn.LazyLinear(2),
    )


def toy_data(n=256, batch_size=32, seed=0):
    """Random 8x8 images whose left half is brighter (label 1) or darker (0), by 0.2 on average."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    X = torch.rand(n, 1, 8, 8, generator=g) * 0.8
    X[..., :4] += 0.2 * y.view(-1, 1, 1, 1)
    X[..., 4:] += 0.2 * (1 - y).view(-1, 1, 1, 1)
    return [(X[i : i + batch_size], y[i : i + batch_size]) for i in range(0, n, batch_size)]


def train_toy(seed=0, num_epochs=EPOCHS, n=256, **options) -> dict:
    """train_concise on toy_data (8 steps per epoch) on the CPU; test on 128 unseen examples."""
    torch.manual_seed(seed)
    train_iter, test_iter = toy_data(n, seed=seed), toy_data(128, seed=seed + 1000)
    return recipe.train_concise(
        small_net(), train_iter, test_iter, num_epochs, LR, ["cpu"], shape=(1, 1, 8, 8),
        plot=False, verbose=False, **options,
    )  # fmt: skip


def loss_ratio(result: dict) -> float:
    """Mean training loss of the last epoch over that of the first."""
    return result["train_losses"][-1] / result["train_losses"][0]


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
        # 6 standard errors of a sample std (0.01 / sqrt(2n)): fails PyTorch's default init,
        # whose std 1/sqrt(3 fan_in) is 0.0085 even for the largest conv (fan_in 4608)
        assert abs(conv.weight.std().item() - 0.01) < 6 * 0.01 / math.sqrt(2 * conv.weight.numel())


def test_scale_for_devices_keeps_per_device_batch():
    assert training.scale_for_devices(256, 0.1, 1) == (256, 0.1)
    batch, lr = training.scale_for_devices(256, 0.1, 2)
    assert batch == 512 and math.isclose(lr, 0.2)
    with pytest.raises(ValueError):
        training.scale_for_devices(256, 0.1, 0)


class OnDevice(nn.Module):
    """A module whose one parameter says it is on `device` (no such device is needed)."""

    def __init__(self, device):
        super().__init__()
        self.where = torch.device(device)

    def parameters(self, recurse=True):
        yield SimpleNamespace(device=self.where)


@pytest.fixture
def fake_dataparallel(monkeypatch):
    """nn.DataParallel replaced by a recorder: the calls data_parallel makes."""
    calls = []

    def record(net, device_ids):
        calls.append((net, device_ids))
        return ("wrapped", net)

    monkeypatch.setattr(nn, "DataParallel", record)
    return calls


@pytest.mark.parametrize(
    "devices",
    [["cpu"], ["cpu", "cpu"], ["cuda:0"], ["cuda:0", "cpu"], ["mps:0"], ["xpu:0", "xpu:1"]],
)
def test_data_parallel_leaves_the_net_alone_without_two_cuda_devices(fake_dataparallel, devices):
    net = OnDevice(devices[0])
    assert training.data_parallel(net, devices) is net  # nothing to split; DP knows only CUDA
    assert fake_dataparallel == []


def test_data_parallel_splits_over_the_cuda_devices_only(fake_dataparallel):
    net = OnDevice("cuda:0")
    wrapped = training.data_parallel(net, ["cuda:0", "cpu", torch.device("cuda", 1)])
    assert wrapped == ("wrapped", net)
    assert fake_dataparallel == [(net, [torch.device("cuda:0"), torch.device("cuda:1")])]
    training.data_parallel(OnDevice("cuda:0"), ["cuda", "cuda:1"])  # 'cuda' = current device
    assert fake_dataparallel[-1][1] == [torch.device("cuda"), torch.device("cuda:1")]


def test_data_parallel_refuses_a_net_not_on_devices0(fake_dataparallel):
    net = nn.Linear(2, 2, device="meta")
    with pytest.raises(ValueError, match="devices\\[0\\]"):
        training.data_parallel(net, [torch.device("cpu")])
    with pytest.raises(ValueError, match="net.to"):  # the book's mistake: net left on the CPU
        training.data_parallel(nn.Linear(2, 2), ["cuda:0", "cuda:1"])
    with pytest.raises(ValueError, match="cuda:1"):
        training.data_parallel(OnDevice("cuda:1"), ["cuda:0", "cuda:1"])
    assert fake_dataparallel == []


def test_warmup_then_cosine_schedule():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = recipe.warmup_cosine(opt, total_steps=10, warmup_steps=2, cosine=True)
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:3] == [0.5, 1.0, 1.0] and lrs[-1] < 0.05
    assert all(a >= b for a, b in zip(lrs[1:], lrs[2:], strict=False))


@pytest.mark.parametrize(
    "device, major, expected",
    [
        ("cpu", None, torch.bfloat16),
        ("xpu:0", None, torch.bfloat16),
        ("cuda:0", 8, torch.bfloat16),  # Ampere and later, ROCm (9+)
        ("cuda:1", 7, torch.float16),  # V100, T4: no bf16
        ("mps", None, torch.float16),
    ],
)
def test_amp_dtype_prefers_bf16(monkeypatch, device, major, expected):
    monkeypatch.setattr(recipe, "_autocast_available", lambda kind: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: (major, 0))
    assert recipe.amp_dtype(device) == expected


@pytest.mark.parametrize("device", ["privateuseone:0", "mps"])
def test_amp_dtype_is_none_without_autocast(monkeypatch, device):
    if device == "mps":  # PyTorch 2.4 has no autocast for MPS
        monkeypatch.setattr(torch.amp, "is_autocast_available", lambda kind: kind != "mps")
    with pytest.warns(UserWarning, match="no mixed precision.*float32"):
        assert recipe.amp_dtype(device) is None  # DirectML: never (torch_directml ignores it)


def dtype_of_output(amp, monkeypatch, autocast=True) -> torch.dtype:
    """dtype of the net's output in one make_step on the CPU with `amp`."""
    monkeypatch.setattr(recipe, "_autocast_available", lambda kind: autocast)
    net = models.materialize(small_net(), (1, 1, 8, 8))
    seen = []
    net.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    step = recipe.make_step(
        net, torch.optim.SGD(net.parameters(), lr=0.1), nn.CrossEntropyLoss(), "cpu", amp=amp
    )
    step(*toy_data(8)[0])
    return seen[0]


def test_make_step_autocasts_only_when_asked(monkeypatch):
    assert dtype_of_output(False, monkeypatch) == torch.float32
    assert dtype_of_output(True, monkeypatch) == torch.bfloat16
    assert dtype_of_output(torch.float16, monkeypatch) == torch.float16
    with pytest.warns(UserWarning, match="float32"):  # amp=True where autocast is missing
        assert dtype_of_output(True, monkeypatch, autocast=False) == torch.float32


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
    r = train_toy(**OPTIONS[name])
    assert loss_ratio(r) < MAX_LOSS_RATIO, r["train_losses"]
    assert r["test_acc"] >= MIN_ACC, r["test_accs"]
    assert len(r["epoch_times"]) == len(r["test_accs"]) == EPOCHS


def test_compile_option_trains(monkeypatch):
    eager = functools.partial(torch.compile, backend="eager")  # dynamo without the C++ compiler
    monkeypatch.setattr(torch, "compile", eager)
    r = train_toy(compile=True)
    assert loss_ratio(r) < MAX_LOSS_RATIO, r["train_losses"]
    assert r["test_acc"] >= MIN_ACC, r["test_accs"]


@pytest.fixture
def host_reads(monkeypatch):
    """Count every way Python code reads a tensor back to the host, and every synchronize()."""
    count = {"n": 0}
    for name in ("item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            count["n"] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    monkeypatch.setattr(training, "synchronize", lambda device=None: count.update(n=count["n"] + 1))
    return count


@pytest.mark.parametrize("options", [{}, {"amp": True, "channels_last": True}])
def test_make_step_reads_nothing_back(host_reads, options):
    net = models.materialize(small_net(), (1, 1, 8, 8))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    step = recipe.make_step(net, opt, nn.CrossEntropyLoss(), "cpu", **options)
    before = [p.detach().clone() for p in net.parameters()]
    host_reads["n"] = 0
    losses = [step(X, y) for X, y in toy_data()]
    assert host_reads["n"] == 0  # 8 steps, no value read back: the host never waits
    assert all(isinstance(l, torch.Tensor) and l.ndim == 0 and not l.requires_grad for l in losses)
    assert any(not torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))


def test_train_concise_syncs_per_epoch_not_per_step(host_reads):
    reads = {}
    for n in (128, 256):  # 4 and 8 steps per epoch
        for sync in (False, True):
            host_reads["n"] = 0
            train_toy(num_epochs=2, n=n, sync_every_step=sync)
            reads[n, sync] = host_reads["n"]
    assert reads[256, False] == reads[128, False]  # twice the steps, no more reads
    assert reads[256, True] - reads[128, True] == 2 * (8 - 4)  # the book's: one read per step


def test_book_style_dataset_matches_resident_batches():
    images = torch.randint(0, 256, (6, 28, 28), dtype=torch.uint8)
    labels = torch.arange(6)
    ds = book.BookStyleDataset(images, labels)
    X, y = ds[3]
    assert X.shape == (1, 28, 28) and X.dtype == torch.float32 and y == 3
    assert torch.equal(X, images[3].unsqueeze(0).float() / 255)
    assert ds[0][0].shape == (1, 28, 28)
    assert book.BookStyleDataset(images, labels, resize=14)[0][0].shape == (1, 14, 14)


def test_training_flops_of_a_linear_layer():
    net = nn.Linear(4, 3)
    X, y = torch.rand(5, 4), torch.zeros(5, dtype=torch.long)
    # forward 2*5*4*3; backward: weight gradient only (X needs no gradient) 2*5*4*3
    assert perf.training_flops(net, X, y) == 2 * (2 * 5 * 4 * 3)
    assert net.weight.grad is None  # counted on a copy
    with pytest.raises(ValueError, match="materialize"):
        perf.training_flops(small_net(), torch.rand(1, 1, 8, 8), torch.zeros(1).long())


@pytest.mark.parametrize(
    "name, low, fp32",
    [
        ("NVIDIA H100 80GB HBM3", 989.4, 66.9),
        ("NVIDIA H100 PCIe", 756.0, 51.2),  # matched before the plain "H100"
        ("NVIDIA L40S", 362.0, 91.6),  # matched before "L40" and "L4"
        ("NVIDIA L4", 121.0, 30.3),
        ("NVIDIA GeForce RTX 4090", None, None),  # not in the table: no fraction of peak
    ],
)
def test_peak_tflops_by_device_name(monkeypatch, name, low, fp32):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: name)
    assert perf.peak_tflops("cuda:0") == low
    assert perf.peak_tflops("cuda:0", low_precision=False) == fp32


def test_peak_tflops_unknown_off_cuda():
    assert perf.peak_tflops("cpu") is None
    assert perf.peak_tflops("mps") is None


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


def test_a_skipped_fp16_step_does_not_advance_the_schedule():
    """GradScaler skips the update of a step whose gradients overflowed; the schedule must not
    move on for it (PyTorch warns "lr_scheduler.step() before optimizer.step()" otherwise)."""
    net = models.materialize(small_net(), (1, 1, 8, 8))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
    step = recipe.make_step(net, opt, nn.CrossEntropyLoss(), "cpu", amp=torch.float16,
                            scheduler=sched)  # fmt: skip
    (X, y), before = toy_data(8)[0], [p.detach().clone() for p in net.parameters()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the scheduler's warning would fail the test
        step(X * 1e6, y)  # float16 overflows: inf gradients, the update is skipped
        assert sched.last_epoch == 0
        assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
        step(X, y)  # an ordinary step: the update and the schedule both happen
    assert sched.last_epoch == 1
    assert any(not torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))


CLIP, CLIP_LR = 0.01, 1.0
FP16_TOL = 1e-4  # float16's rounding; measured 1.4e-6 against an update of 4.5e-3


def _clip_reference():
    """A linear model, one batch, and its SGD update with the gradients clipped by hand."""
    torch.manual_seed(0)
    net = nn.Linear(16, 4)
    X, y = torch.randn(32, 16) * 0.5, torch.randint(0, 4, (32,))
    ref = nn.Linear(16, 4)
    ref.load_state_dict(net.state_dict())
    opt = torch.optim.SGD(ref.parameters(), lr=CLIP_LR)
    nn.functional.cross_entropy(ref(X), y).backward()
    norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP)
    assert norm > 10 * CLIP  # the clip really acts
    opt.step()
    return net, X, y, [p.detach() for p in ref.parameters()]


def _largest_gap(net, expected) -> float:
    return max(
        (a.detach() - b).abs().max().item() for a, b in zip(net.parameters(), expected, strict=True)
    )


@pytest.mark.parametrize("amp", [False, torch.float16])
def test_clip_acts_on_the_true_gradients(amp):
    """fp32: the update of clipping by hand, exactly; fp16 with GradScaler: the gradients are
    unscaled before clipping, so the update matches up to float16's rounding."""
    net, X, y, expected = _clip_reference()
    start = [p.detach().clone() for p in net.parameters()]
    opt = torch.optim.SGD(net.parameters(), lr=CLIP_LR)
    step = recipe.make_step(net, opt, nn.CrossEntropyLoss(), "cpu", amp=amp, clip=CLIP)
    step(X, y)
    assert any(
        not torch.equal(a, b) for a, b in zip(net.parameters(), start, strict=True)
    )  # not skipped
    assert _largest_gap(net, expected) <= (0 if amp is False else FP16_TOL)


def test_clipping_the_scaled_gradients_is_caught():
    """The negative control: a step that clips before unscaling (a test-only copy of make_step's
    fp16 branch without unscale_) clips gradients 65536 times too large, so its update is 65536
    times too small, and the comparison above refuses it."""
    net, X, y, expected = _clip_reference()
    opt = torch.optim.SGD(net.parameters(), lr=CLIP_LR)
    scaler = torch.amp.GradScaler("cpu")
    with torch.autocast("cpu", dtype=torch.float16):
        loss = nn.functional.cross_entropy(net(X), y)
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)  # the mistake: scaled gradients
    scaler.step(opt)
    scaler.update()
    assert _largest_gap(net, expected) > 10 * FP16_TOL


@pytest.mark.parametrize("clip", [0, -1.0, "1", float("nan")])
def test_a_clip_that_is_no_norm_is_refused(clip):
    net = nn.Linear(2, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="clip must be a positive gradient norm"):
        recipe.make_step(net, opt, nn.CrossEntropyLoss(), "cpu", clip=clip)


def test_emulated_low_precision_is_not_called_native(monkeypatch):
    """Issue 39: with an AVX2 laptop's kernels bf16 is emulated (a ResNet step 18 times slower)."""
    import torch

    from d2l_gpu import native_low_precision

    cpu = torch.device("cpu")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert native_low_precision(cpu) is False
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "ALL")
    for units, expected in ((False, False), (True, True)):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda u=units: u)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
        assert native_low_precision(cpu) is expected
    assert native_low_precision(torch.device("meta")) is False  # no autocast there at all
