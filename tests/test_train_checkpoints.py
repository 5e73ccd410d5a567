"""Checkpoints of the training script: atomic writes, outputs checked before training, resumes
refused with a sentence when the checkpoint belongs to another job, divergence stopped."""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from train_launch import ARGS, job_env, load, run

from d2l_gpu import train
from d2l_gpu.train import checkpoint

SMALL = ["--epochs", "1", "--limit", "64"]


@pytest.fixture
def ckpt_path(lone, tmp_path) -> Path:
    """A checkpoint written by a one-epoch job of ARGS + SMALL."""
    path = tmp_path / "ckpt.pt"
    assert train.main([*ARGS, *SMALL, "--checkpoint", str(path)]) == 0
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_resume_with_other_settings_refused_listing_each(ckpt_path, capsys):
    capsys.readouterr()
    other = ["--lr", "0.5", "--seed", "4", "--batch-size", "16", "--limit", "32"]
    assert train.main([*ARGS, *SMALL, *other, "--checkpoint", str(ckpt_path)]) == 2
    err = capsys.readouterr().err
    for said in ("--lr 0.1 (now 0.5)", "--seed 3 (now 4)", "--batch-size 32 (now 16)",
                 "--limit 64 (now 32)", "start afresh with another --checkpoint path"):  # fmt: skip
        assert said in err, err
    assert load(ckpt_path)["epoch"] == 1


def test_resume_from_another_data_folder_refused(ckpt_path, tmp_path, capsys):
    other = tmp_path / "other-data"
    other.mkdir()
    for f in Path(os.environ["D2L_GPU_DATA"]).iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    capsys.readouterr()
    assert (
        train.main([*ARGS, *SMALL, "--data-dir", str(other), "--checkpoint", str(ckpt_path)]) == 2
    )
    assert "--data-dir" in capsys.readouterr().err


def test_more_epochs_continue_and_say_so(ckpt_path, capsys):
    capsys.readouterr()
    assert (
        train.main([*ARGS, "--epochs", "2", "--limit", "64", "--checkpoint", str(ckpt_path)]) == 0
    )
    out = capsys.readouterr().out
    assert "resumed from" in out and "1 of 2 epochs done" in out
    assert "continuing with --epochs 2 (the checkpoint's job had 1)" in out
    assert load(ckpt_path)["epoch"] == 2


def test_other_model_refused_another_world_size_said(ckpt_path, capsys):
    assert train.main([*ARGS, *SMALL, "--model", "resnet18", "--checkpoint", str(ckpt_path)]) == 2
    assert "--model lenet (now resnet18)" in capsys.readouterr().err
    two = load(ckpt_path)  # as if written by two ranks: one random-number state each
    checkpoint.save_atomic({**two, "world_size": 2, "rng": two["rng"] * 2}, ckpt_path)
    assert train.main([*ARGS, *SMALL, "--epochs", "2", "--checkpoint", str(ckpt_path)]) == 0
    said = capsys.readouterr().out
    assert "continuing with world size 1 (the checkpoint's job had 2)" in said


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda c: c["model_state"].update({"params.0": torch.zeros(3)}), "params.0 is torch"),
        (lambda c: c["model_state"].pop("params.7"), "missing params.7"),
        (lambda c: c["model_state"].update({"extra": torch.zeros(1)}), "unexpected extra"),
        (lambda c: c.update(model_state=[1, 2]), "holds no model state"),
        (lambda c: c.update(rng=[{}]), "no valid random-number state"),
        (lambda c: c.update(rng=[]), "random-number state per rank"),
        (lambda c: c["optimizer_state"].update(param_groups=[{"lr": 0.1}]), "optimizer state"),
        (lambda c: c.update(epoch=-3), "epoch -3 (a whole number from 0 to 1)"),
        (lambda c: c.update(epoch="one"), "epoch 'one'"),
        (lambda c: c.update(epoch=5), "epoch 5 (a whole number from 0 to 1)"),
        (lambda c: c["optimizer_state"]["param_groups"][0].update(momentum="x"), "momentum 'x'"),
        (lambda c: c["optimizer_state"]["param_groups"][0].update(lr=float("nan")), "lr nan"),
    ],
)  # fmt: skip
def test_checkpoint_that_does_not_fit_is_refused(ckpt_path, capsys, damage, message):
    ckpt = load(ckpt_path)
    damage(ckpt)
    checkpoint.save_atomic(ckpt, ckpt_path)
    before = digest(ckpt_path)
    capsys.readouterr()
    assert train.main([*ARGS, *SMALL, "--checkpoint", str(ckpt_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert digest(ckpt_path) == before  # left as it was


def test_a_damaged_checkpoint_is_refused_by_its_checksums(ckpt_path, capsys):
    """Issue 27: 4 KiB flipped mid-file were resumed from (torch.load checks no CRC)."""
    data = bytearray(ckpt_path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = bytes(b ^ 0xFF for b in data[middle : middle + 4096])
    ckpt_path.write_bytes(bytes(data))
    before = digest(ckpt_path)
    capsys.readouterr()
    assert train.main([*ARGS, *SMALL, "--checkpoint", str(ckpt_path)]) == 2
    err = capsys.readouterr().err
    assert "is damaged" in err and "move it away" in err and "Traceback" not in err, err
    assert digest(ckpt_path) == before  # kept, for whoever wants to look at it


def test_unreadable_or_foreign_checkpoint_refused_without_delete_advice(lone, tmp_path, capsys):
    path = tmp_path / "ckpt.pt"
    for content, message in ((b"not a checkpoint", "cannot be read"),
                             (None, "is not a checkpoint of this training script")):  # fmt: skip
        if content is None:
            torch.save({"epoch": 1}, path)
        else:
            path.write_bytes(content)
        assert train.main([*ARGS, *SMALL, "--checkpoint", str(path)]) == 2
        err = capsys.readouterr().err
        assert message in err and "move it away" in err and "delete" not in err


@pytest.mark.parametrize("flag", ["--checkpoint", "--save"])
def test_output_that_is_a_folder_refused_before_training(lone, tmp_path, capsys, flag):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("something of the user's")
    assert train.main([*ARGS, *SMALL, flag, str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert "is a folder; give the path of a file in it" in captured.err
    assert "delete" not in captured.err and "epoch 1" not in captured.out  # nothing trained
    assert (tmp_path / "out" / "keep.txt").exists()


def unwritable_folders(tmp_path: Path):
    """Folders this process cannot create files in, even as root where it can say so."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    yield blocker / "sub"  # a path under a regular file: not a folder
    if Path("/sys/kernel").is_dir():
        yield Path("/sys/kernel")  # read-only even for root
    if os.geteuid() != 0:
        ro = tmp_path / "read-only"
        ro.mkdir(mode=0o555)
        yield ro


@pytest.mark.parametrize("flag", ["--checkpoint", "--save"])
def test_unwritable_output_refused_before_training(lone, tmp_path, capsys, flag):
    for folder in unwritable_folders(tmp_path):
        assert train.main([*ARGS, *SMALL, flag, str(folder / "out.pt")]) == 2
        captured = capsys.readouterr()
        assert f"{flag} '{folder / 'out.pt'}' cannot be written" in captured.err, captured.err
        assert "epoch 1" not in captured.out  # refused before the first step


def test_non_finite_loss_stops_keeping_the_last_good_checkpoint(ckpt_path, tmp_path, capsys):
    """A model whose weights blow up in epoch 2: exit 2, checkpoint of epoch 1 kept, no --save."""
    ckpt = load(ckpt_path)
    ckpt["model_state"]["params.6"] = ckpt["model_state"]["params.6"] * 1e38
    checkpoint.save_atomic(ckpt, ckpt_path)
    before, final = digest(ckpt_path), tmp_path / "final.pt"
    capsys.readouterr()
    cmd = [*ARGS, "--epochs", "2", "--limit", "64", "--checkpoint", str(ckpt_path)]
    assert train.main([*cmd, "--save", str(final)]) == 2
    err = capsys.readouterr().err
    assert "the training loss became" in err and "in epoch 2" in err, err
    assert f"{ckpt_path} keeps epoch 1" in err and "smaller --lr" in err
    assert digest(ckpt_path) == before and not final.exists()


def test_huge_lr_stops_in_the_first_epoch(lone, tmp_path, capsys):
    final = tmp_path / "final.pt"
    assert train.main([*ARGS, *SMALL, "--lr", "1e30", "--save", str(final)]) == 2
    assert "training diverged, try a smaller --lr than 1e+30" in capsys.readouterr().err
    assert not final.exists()


def test_atomic_save_survives_an_exception(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    checkpoint.save_atomic({"epoch": torch.tensor(1)}, path)

    def half_write(obj, f):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", half_write)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_atomic({"epoch": torch.tensor(2)}, path)
    assert load(path)["epoch"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]


@pytest.mark.slow
def test_atomic_save_survives_sigkill(tmp_path, small_data):
    """A writer SIGKILLed after writing the new data, before the rename, leaves the old file."""
    path = tmp_path / "ckpt.pt"
    code = textwrap.dedent(f"""
        import os, signal, torch
        from d2l_gpu.train.checkpoint import save_atomic
        save_atomic({{"epoch": torch.tensor(1)}}, {str(path)!r})
        os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
        save_atomic({{"epoch": torch.tensor(2), "big": torch.zeros(10**6)}}, {str(path)!r})
    """)
    status, out = run([sys.executable, "-c", code], job_env(small_data), tmp_path, check=False)
    assert status == -signal.SIGKILL, out
    assert load(path)["epoch"] == 1
    assert len(list(tmp_path.glob(".ckpt.pt.*.tmp"))) == 1  # the dead writer's temporary file
    checkpoint.save_atomic({"epoch": torch.tensor(3)}, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]
    assert load(path)["epoch"] == 3
