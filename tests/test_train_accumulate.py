"""`--accumulate A`: gradient accumulation inside each rank's part of a global batch.

The global batch stays what --batch-size says; each rank cuts its part into A micro-batches,
adds up their gradients locally (DDP's `no_sync`, FSDP2's `set_requires_gradient_sync(False)`)
and synchronises once, after the last. So the job equals one process without accumulation,
in float64 to 1e-12, and each step all-reduces each gradient bucket once, not A times.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from conftest import skip_strategies_this_torch_lacks
from train_launch import ARGS, ARGS64, load, max_diff, run_forked, run_here

from d2l_gpu import train
from d2l_gpu.models import LeNet
from d2l_gpu.train.config import Placement, TrainConfig
from d2l_gpu.train.strategies.ddp import DDPStrategy


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_accumulated_micro_batches_equal_one_process(job_env, tmp_path, one_process, strategy):
    """2 ranks x 4 micro-batches of 4 examples = one process with global batches of 32."""
    skip_strategies_this_torch_lacks(strategy)
    extra = ["--strategy", strategy, "--accumulate", "4", "--save", "final.pt"]
    code, out = run_forked(2, [*ARGS64, *extra], job_env, tmp_path)
    assert code == 0, out
    assert f"world size 2 (gloo, cpu, {strategy})" in out, out
    assert max_diff(load(tmp_path / "final.pt"), one_process) < 1e-12


def test_global_batches_of_the_micro_batches_size_end_elsewhere(
    job_env, tmp_path, one_process, monkeypatch
):
    """The negative control of the test above: a job whose global batch is 8 (the size of the
    micro-batches) ends far from the one with global batches of 32."""
    args = [*ARGS64, "--batch-size", "8", "--save", "final.pt"]  # the last --batch-size wins
    run_here(args, job_env, tmp_path, monkeypatch)
    assert max_diff(load(tmp_path / "final.pt"), one_process) > 1e-6


@pytest.fixture
def group(tmp_path):
    """This process as a gloo group of one."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def all_reduces_per_step(accumulate: int, monkeypatch=None) -> int:
    """How many gradient all-reduces DDP launches in one training step of LeNet."""
    cfg = TrainConfig(accumulate=accumulate, batch_size=8)
    strategy = DDPStrategy(LeNet(seed=0), cfg, Placement(0, 1, torch.device("cpu")))
    if monkeypatch is not None:  # the negative control: a strategy that never holds back
        monkeypatch.setattr(strategy, "no_sync", lambda: torch.enable_grad())
    calls = []

    def counting(state, bucket):
        calls.append(bucket.index())
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    strategy.model.register_comm_hook(None, counting)
    X, y = torch.rand(8, 1, 28, 28), torch.randint(0, 10, (8,))
    strategy.train_step(X, y)  # the first step: DDP has one bucket per its default size
    return len(calls)


def test_accumulation_synchronises_once_per_step(group, monkeypatch):
    once = all_reduces_per_step(1)
    assert once >= 1
    assert all_reduces_per_step(4) == once  # 4 micro-batches, one synchronisation
    assert all_reduces_per_step(4, monkeypatch) == 4 * once  # without no_sync: one per backward


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--accumulate", "0"], "--accumulate must be a positive integer, got 0"),
        (["--accumulate", "64"], "--accumulate 64 cuts each rank's 32 examples of a global batch"),
        (["--strategy", "pipeline", "--accumulate", "2"], "--accumulate 2 is for --strategy ddp"),
    ],
)
def test_bad_accumulation_refused_with_a_sentence(lone, capsys, extra, message):
    if "--strategy" in extra:
        skip_strategies_this_torch_lacks(extra[extra.index("--strategy") + 1])
    try:
        status = train.main([*ARGS, *extra])
    except SystemExit as e:  # a bad flag value: argparse's own exit
        status = e.code
    assert status == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
