"""The training script under faults (issue 27): a full disk, a final error under --max-restarts,
Ctrl-C, and an agent that dies; each ends with one sentence and a status that says what helps."""

from __future__ import annotations

import errno
import io
import os
import signal
import time

import pytest
from train_launch import ARGS, TIMEOUT, job_env, launched, load, run, torchrun

from d2l_gpu import train
from d2l_gpu.distributed import worker_pids
from d2l_gpu.train import checkpoint

LONG = ["--epochs", "40", "--limit", "256"]  # long enough to be interrupted after epoch 1


def test_a_full_disk_keeps_the_last_checkpoint_and_says_what_is_needed(
    lone, tmp_path, capsys, monkeypatch
):
    path = tmp_path / "ckpt.pt"
    real, calls = checkpoint.torch.save, []

    def save(obj, f, *args, **kwargs):
        if isinstance(f, io.BytesIO):  # the collectives pickle objects with torch.save too
            return real(obj, f, *args, **kwargs)
        calls.append(1)
        if len(calls) >= 2:  # the checkpoint of epoch 2 meets a full disk
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64")
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", save)
    status = train.main([*ARGS, "--epochs", "3", "--limit", "64", "--checkpoint", str(path)])
    err = capsys.readouterr().err
    assert status == 2
    assert f"cannot write the checkpoint {str(path)!r}" in err and "MiB are free" in err
    assert "the last good checkpoint is kept" in err and "Traceback" not in err
    assert load(path)["epoch"] == 1 and not list(tmp_path.glob(".ckpt.pt.*.tmp"))


def test_a_write_error_is_said_with_its_reason(lone, tmp_path, capsys, monkeypatch):
    real = checkpoint.torch.save

    def full(obj, f, *args, **kwargs):
        if isinstance(f, io.BytesIO):  # the collectives pickle objects with torch.save too
            return real(obj, f, *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", full)
    path = tmp_path / "ckpt.pt"
    assert train.main([*ARGS, "--epochs", "1", "--limit", "64", "--checkpoint", str(path)]) == 2
    err = capsys.readouterr().err
    assert "(No space left on device)" in err and "no checkpoint exists yet" in err


def test_a_final_error_is_not_restarted(small_data, tmp_path):
    """Issue 27: a job that cannot run as asked was relaunched by --max-restarts 3, four times."""
    cmd, env = torchrun(2, job_env(small_data), tmp_path, "--max-restarts", "3")
    status, out = run([*cmd, "-m", "d2l_gpu.train", *ARGS, "--batch-size", "31"], env, tmp_path,
                      check=False)  # fmt: skip
    assert status != 0
    assert 1 <= out.count("is not divisible by the world size 2") <= 2  # once per rank at most
    assert "will restart worker group" not in out and "attempts left" not in out.replace(
        "3/3 attempts left", ""
    )


def _after_first_checkpoint(proc, path, deadline):
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.02)


def test_ctrl_c_ends_every_rank_with_one_sentence(small_data, tmp_path):
    cmd, env = torchrun(2, job_env(small_data), tmp_path)
    path = tmp_path / "ckpt.pt"
    with launched([*cmd, "-m", "d2l_gpu.train", *ARGS, *LONG, "--checkpoint", str(path)], env,
                  tmp_path) as proc:  # fmt: skip
        _after_first_checkpoint(proc, path, time.monotonic() + TIMEOUT)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal does: the whole foreground group
        out, _ = proc.communicate(timeout=TIMEOUT)
    assert out.count("d2l_gpu.train: stopped by Ctrl-C; the checkpoint") == 1, out
    assert "is kept: run the same command to resume" in out
    assert "KeyboardInterrupt" not in out and 'd2l_gpu/train.py", line' not in out
    assert load(path)["epoch"] >= 1


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="worker_pids reads /proc")
def test_workers_end_when_their_agent_is_killed(small_data, tmp_path):
    """Issue 27: a SIGKILLed agent left its workers training unsupervised to the end."""
    cmd, env = torchrun(2, job_env(small_data), tmp_path)
    path = tmp_path / "ckpt.pt"
    with launched([*cmd, "-m", "d2l_gpu.train", *ARGS, *LONG, "--checkpoint", str(path)], env,
                  tmp_path) as proc:  # fmt: skip
        _after_first_checkpoint(proc, path, time.monotonic() + TIMEOUT)
        workers = list(worker_pids(proc.pid).values())
        assert len(workers) == 2
        os.kill(proc.pid, signal.SIGKILL)  # the agent only
        deadline = time.monotonic() + 20
        while any(os.path.exists(f"/proc/{pid}") and not _zombie(pid) for pid in workers):
            assert time.monotonic() < deadline, "workers outlived their agent"
            time.sleep(0.05)
        out, _ = proc.communicate(timeout=30)
    assert "the torchrun agent that started it is gone" in out


def _zombie(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return True
