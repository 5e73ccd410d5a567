"""The training script's settings: flags refused at parse time, TrainConfig, sizes, shards."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch
from train_launch import ARGS, ROOT, job_env

from d2l_gpu import ddp, train


@pytest.mark.parametrize("lr", ["nan", "inf", "-inf", "-1", "0", "fast"])
def test_bad_lr_refused_at_parse_time(lr, capsys):
    with pytest.raises(SystemExit) as stop:
        train.parse_args(["--lr", lr])
    assert stop.value.code == 2
    assert "argument --lr:" in capsys.readouterr().err


@pytest.mark.parametrize("seed", ["18446744073709551616", str(2**32), "-1", "1.5", "lucky"])
def test_a_seed_pytorch_cannot_take_is_refused_at_parse_time(seed, capsys):
    """Issue 46: 2**64 ended in a traceback from torch.manual_seed on rank 0 (exit 1)."""
    with pytest.raises(SystemExit) as stop:
        train.parse_args(["--seed", seed])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "argument --seed:" in err and "Traceback" not in err


def test_a_seed_out_of_range_is_refused_by_the_settings_too():
    assert train.parse_args(["--seed", str(2**32 - 1)]).seed == 2**32 - 1  # the largest works
    with pytest.raises(ValueError, match="--seed must be a whole number from 0 to 4294967295"):
        train.TrainConfig(seed=2**64)


@pytest.mark.parametrize(("rank", "said"), [("0", True), ("1", False), ("3", False)])
def test_a_refusal_under_torchrun_is_said_once_by_rank_0(rank, said, monkeypatch, capsys):
    """Issue 46: every rank printed the usage and the sentence; now rank 0 says it, all exit 2."""
    monkeypatch.setenv("RANK", rank)
    with pytest.raises(SystemExit) as stop:
        train.parse_args(["--model", "lenet", "--strategy", "fsdp-tp"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert ("--strategy fsdp-tp splits a transformer" in err) is said
    assert said or err == ""


def test_checkpoint_and_save_the_same_file_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        train.parse_args(["--checkpoint", "x.pt", "--save", str(tmp_path / "x.pt")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--checkpoint and --save name the same file" in err and "give --save another" in err


@pytest.mark.parametrize("flag", ["--epochs", "--batch-size", "--limit"])
def test_non_positive_sizes_refused(flag, capsys):
    with pytest.raises(SystemExit):
        train.parse_args([flag, "0"])
    assert f"{flag} must be a positive integer" in capsys.readouterr().err


def test_flags_fill_a_frozen_config():
    cfg = train.parse_args([*ARGS, "--checkpoint", "c.pt", "--no-progress"])
    assert cfg == train.TrainConfig(epochs=2, batch_size=32, lr=0.1, seed=3, checkpoint="c.pt",
                                    progress=False)  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 0.5
    with pytest.raises(ValueError, match="--lr must be a positive finite number"):
        train.TrainConfig(lr=float("nan"))  # also when built from Python, not the command line
    assert set(cfg.settings()) == set(cfg.MUST_MATCH + cfg.MAY_CHANGE)
    assert "checkpoint" not in cfg.settings() and "progress" not in cfg.settings()


def test_ddp_module_runs_the_same_script(small_data):
    """`python -m d2l_gpu.ddp` (the old name) still parses and runs the training script."""
    assert ddp.main is train.main and ddp.DDPError is train.TrainError
    out = subprocess.run(
        [sys.executable, "-m", "d2l_gpu.ddp", "--lr", "nan"], cwd=ROOT, env=job_env(small_data),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2 and "python -m d2l_gpu.ddp: error: argument --lr" in out.stderr


@pytest.mark.parametrize(
    ("world", "extra", "message"),
    [
        (2, ["--batch-size", "31"], "not divisible by the world size 2"),
        (4, ["--limit", "3", "--batch-size", "4"], "4 ranks but only 3 training examples"),
        (1, ["--limit", "8", "--batch-size", "16"], "exceeds the 8 training examples"),
    ],
)
def test_size_errors(lone, monkeypatch, capsys, world, extra, message):
    monkeypatch.setenv("WORLD_SIZE", str(world))  # checked before joining the group
    assert train.main([*ARGS, *extra]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA devices")
def test_nccl_without_a_gpu_per_rank_refused(lone, capsys):
    assert train.main([*ARGS, "--backend", "nccl", "--limit", "64"]) == 2
    err = capsys.readouterr().err
    assert "NCCL needs a CUDA device per rank" in err and "Traceback" not in err


def test_progress_bar_on_request(lone, capsys):
    assert train.main([*ARGS, "--epochs", "1", "--limit", "64", "--progress"]) == 0
    # the bar was drawn for the epoch's 2 steps; whether it was redrawn at 100% before being
    # cleared depends on the machine's speed (tqdm redraws at most every 0.1 s)
    err = capsys.readouterr().err
    assert "epoch 1:" in err and "/2 [" in err, err
    assert train.main([*ARGS, "--epochs", "1", "--limit", "64"]) == 0
    assert "%|" not in capsys.readouterr().err  # not a terminal: quiet by default


def test_shards_cover_each_global_batch_once():
    n, batch, world = 100, 12, 3
    per_epoch = []
    for epoch in range(2):
        shards = [train.shard_indices(n, batch, epoch, 7, r, world) for r in range(world)]
        assert all(s.shape == (n // batch, batch // world) for s in shards)
        whole = torch.cat(shards, dim=1)  # global batch i = rank 0's slice, rank 1's, ...
        assert len(whole.flatten().unique()) == n // batch * batch
        assert torch.equal(whole, train.shard_indices(n, batch, epoch, 7, 0, 1))
        per_epoch.append(whole)
    assert not torch.equal(per_epoch[0], per_epoch[1])  # reshuffled every epoch


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model", "lenet", "--sync-bn"], "--model lenet has no BatchNorm"),
        (["--model", "transformer", "--sync-bn"], "--model transformer has no BatchNorm"),
        (["--model", "resnet18", "--strategy", "fsdp", "--sync-bn"],
         "--sync-bn works with --strategy ddp"),
        (["--model", "transformer", "--data-dir", "."], "reads Python's own help text"),
        (["--strategy", "fsdp-tp"], "--model lenet has none: use --model transformer"),
        (["--model", "transformer", "--tp", "0"], "--tp must be a positive integer"),
    ],
)  # fmt: skip
def test_flags_that_mean_nothing_for_the_model_refused(extra, message, capsys):
    with pytest.raises(SystemExit) as stop:
        train.parse_args(extra)
    assert stop.value.code == 2 and message in capsys.readouterr().err
