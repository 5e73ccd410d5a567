"""`GlobalBatchNorm` (the training script's --sync-bn off CUDA) normalises as one process would.

Two gloo processes each hold half of a batch. With GlobalBatchNorm their outputs, the gradients
of their inputs, the sum of their parameter gradients and their running statistics equal those of
an ordinary BatchNorm on the whole batch in one process (float64). A plain BatchNorm per rank, the
negative control, differs. The training script: ResNet-18 with --sync-bn on 2 ranks equals one
process; without it, it does not.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from train_launch import load, max_diff, run_forked, run_here

from d2l_gpu.parallel.sync_batchnorm import GlobalBatchNorm, sync_batchnorm
from d2l_gpu.workers import run_workers

SHAPES = [(8, 3, 5, 4), (6, 4)]  # images (BatchNorm2d) and features (BatchNorm1d)


def batch(shape) -> tuple[torch.Tensor, torch.Tensor]:
    """A whole batch with per-channel offsets, and the upstream gradient of its output."""
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 3 + torch.arange(shape[1]).view(
        1, -1, *[1] * (len(shape) - 2)
    )
    return x, torch.randn(shape, generator=g, dtype=torch.float64)


def layer(kind, channels: int, dims: int) -> nn.Module:
    """`kind`, or the BatchNorm of the input's rank; weights not 1 and 0, so that they matter."""
    cls = kind if kind is GlobalBatchNorm else {2: nn.BatchNorm1d, 4: nn.BatchNorm2d}[dims]
    bn = cls(channels, momentum=0.3).double()
    with torch.no_grad():
        bn.weight.copy_(torch.linspace(0.5, 2.0, channels))
        bn.bias.copy_(torch.linspace(-1.0, 1.0, channels))
    return bn


def step(bn: nn.Module, x: torch.Tensor, grad: torch.Tensor) -> dict:
    """Two training forwards and one backward; everything a rank ends with."""
    x = x.clone().requires_grad_()
    bn(x * 0.5)  # a first batch: the running statistics move twice
    out = bn(x)
    out.backward(grad)
    return {
        "out": out.detach(), "x.grad": x.grad, "weight.grad": bn.weight.grad.clone(),
        "bias.grad": bn.bias.grad.clone(), "running_mean": bn.running_mean.clone(),
        "running_var": bn.running_var.clone(),
    }  # fmt: skip


def halves(rank: int, world: int, kind) -> list[dict]:
    """This rank's results for its half of each batch, with `kind` as its layer."""
    import torch.distributed as dist

    found = []
    for shape in SHAPES:
        x, grad = batch(shape)
        part = slice(rank * shape[0] // world, (rank + 1) * shape[0] // world)
        mine = step(layer(kind, shape[1], len(shape)), x[part], grad[part])
        for name in ("weight.grad", "bias.grad"):  # each rank holds its share: sum them
            dist.all_reduce(mine[name])
        found.append(mine)
    return found


@pytest.fixture(scope="module")
def ranks():
    """Both layers on 2 processes (one group: starting processes is the slow part)."""
    return run_workers(both, 2)


def both(rank: int, world: int) -> dict:
    return {"global": halves(rank, world, GlobalBatchNorm), "plain": halves(rank, world, None)}


def whole() -> list[dict]:
    """An ordinary BatchNorm on each whole batch, in this process."""
    return [step(layer(None, s[1], len(s)), *batch(s)) for s in SHAPES]


def gaps(found: list[list[dict]], agree: bool = True) -> dict[str, float]:
    """Largest difference of each result from one process (outputs and input grads re-joined)."""
    out = {}
    for i, one in enumerate(whole()):
        for name, expected in one.items():
            joined = [r[i][name] for r in found]
            got = torch.cat(joined) if name in ("out", "x.grad") else joined[0]
            out[name] = max(out.get(name, 0.0), (got - expected).abs().max().item())
            if agree and name not in ("out", "x.grad"):  # every rank ends with the same values
                assert all(torch.equal(joined[0], other) for other in joined[1:]), name
    return out


def test_two_ranks_equal_one_batchnorm_on_the_whole_batch(ranks):
    assert max(gaps([r["global"] for r in ranks]).values()) < 1e-12


def test_plain_batchnorm_per_rank_differs(ranks):
    """Negative control: each rank's own statistics change outputs, gradients and running stats."""
    found = gaps([r["plain"] for r in ranks], agree=False)
    assert all(found[name] > 1e-3 for name in ("out", "x.grad", "weight.grad", "running_var"))


def test_one_process_is_the_ordinary_layer():
    """Without a group (or in evaluation) GlobalBatchNorm is nn.BatchNorm: same results."""
    x, grad = batch(SHAPES[0])
    ours, theirs = step(layer(GlobalBatchNorm, 3, 4), x, grad), step(layer(None, 3, 4), x, grad)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_sync_batchnorm_picks_the_layer_for_the_device():
    """PyTorch's SyncBatchNorm where it has kernels; ours elsewhere, on the same tensors."""
    from d2l_gpu.models import init_every_layer, resnet18

    for device, kind in (("cuda", nn.SyncBatchNorm), ("cpu", GlobalBatchNorm)):
        net = init_every_layer(resnet18())
        weights = {id(p) for p in net.parameters()}
        net = sync_batchnorm(net, torch.device(device))
        assert sum(isinstance(m, kind) for m in net.modules()) == 17
        assert not any(type(m) is nn.BatchNorm2d for m in net.modules())
        assert {id(p) for p in net.parameters()} == weights  # nothing copied, nothing new
    with pytest.raises(ValueError, match="materialize"):  # lazy BatchNorms know no channels
        sync_batchnorm(resnet18(), torch.device("cpu"))


RESNET = ["--model", "resnet18", "--epochs", "1", "--batch-size", "8", "--limit", "16"]
RESNET += ["--lr", "0.1", "--seed", "3", "--dtype", "float64"]


@pytest.mark.slow
def test_sync_bn_makes_two_ranks_train_resnet18_as_one_process(job_env, tmp_path):
    """Two steps of ResNet-18 in float64 (4 examples per rank): with --sync-bn 2 ranks = 1 process;
    without it (the negative control) each rank normalises its own 4 examples."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        run_here([*RESNET, "--save", "one.pt"], job_env, tmp_path, monkeypatch)
    one = load(tmp_path / "one.pt")
    found = {}
    for flag in ("--sync-bn", "--no-sync-bn"):
        code, out = run_forked(2, [*RESNET, flag, "--save", "two.pt"], job_env, tmp_path)
        assert code == 0, out
        assert "resnet18: world size 2 (gloo, cpu, ddp)" in out, out
        found[flag] = max_diff(load(tmp_path / "two.pt"), one)
    # measured over seeds 0-5: 1e-12 to 2.6e-11 with --sync-bn, 0.25 without. BatchNorm divides by
    # the standard deviations of a few small activations, so the rounding of sums added in another
    # order (2 ranks) grows about 1e5 times in two steps, far more than in LeNet: hence 1e-8
    assert found["--sync-bn"] < 1e-8 and found["--no-sync-bn"] > 1e-3, found
