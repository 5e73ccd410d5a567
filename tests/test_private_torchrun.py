"""python -m d2l_gpu.torchrun: torchrun on one machine that leaves no file behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from train_launch import ARGS, job_env

from d2l_gpu import torchrun


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        ([], "say how many workers"),
        (["--nproc-per-node", "2", "--nnodes", "2", "x.py"], "one machine"),
    ],
)
def test_wrong_use_is_one_sentence_and_exit_2(argv, said, capsys):
    assert torchrun.main(argv) == 2
    assert said in capsys.readouterr().err


def _left_in_tmp(launcher: list[str], small_data, tmp_path) -> list[str]:
    """What a one-epoch two-rank job started by `launcher` leaves in its TMPDIR."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(parents=True)
    env = {**job_env(small_data), "TMPDIR": str(tmp), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    cmd = [sys.executable, "-m", *launcher, "--nproc-per-node", "2", "-m", "d2l_gpu.train"]
    done = subprocess.run([*cmd, *ARGS, "--epochs", "1"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "world size 2" in done.stdout
    return sorted(n for n in os.listdir(tmp) if not n.startswith("torchinductor_"))  # a cache


@pytest.mark.slow
def test_a_job_leaves_no_rendezvous_file_or_log_folder(small_data, tmp_path):
    assert _left_in_tmp(["d2l_gpu.torchrun"], small_data, tmp_path / "ours") == []
    plain = ["torch.distributed.run", "--rdzv-backend", "c10d", "--rdzv-conf", "store_type=file",
             "--local-addr", "127.0.0.1"]  # fmt: skip
    left = _left_in_tmp(plain, small_data, tmp_path / "plain")  # the README's old short form
    assert any(n.startswith("torchelastic_") for n in left) and any(
        n.startswith("tmp") and "torchelastic" not in n for n in left
    ), left
