"""`python -m d2l_gpu.ddp` under torchrun on this CPU: equivalence, restarts, two nodes, errors.

Every process runs on 127.0.0.1 with gloo, on ports found free by binding port 0, on a small
synthetic Fashion-MNIST in the real IDX format (D2L_GPU_DATA). Each launch has a time limit and is
started in its own session, whose whole process group is killed when the test ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from d2l_gpu import checkpoint, ddp

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
SCRIPT = ["-m", "d2l_gpu.ddp"]
N_TRAIN, N_TEST, BATCH = 256, 64, 32  # 8 steps per epoch
ARGS = ["--model", "lenet", "--epochs", "2", "--batch-size", str(BATCH), "--lr", "0.1"]
ARGS += ["--seed", "3"]
TIMEOUT = 90


def write_idx(folder: Path, n_train: int = N_TRAIN, n_test: int = N_TEST, seed: int = 0) -> Path:
    """Write four small Fashion-MNIST-format IDX files (random images, labels) into `folder`."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        header = np.array([0x803, n, 28, 28], dtype=">u4").tobytes()
        (folder / f"{split}-images-idx3-ubyte").write_bytes(header + images.tobytes())
        header = np.array([0x801, n], dtype=">u4").tobytes()
        (folder / f"{split}-labels-idx1-ubyte").write_bytes(header + labels.tobytes())
    return folder


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    """Environment of the launched processes: small data, one thread, loopback, no stray ranks."""
    data = write_idx(tmp_path_factory.mktemp("fashion-mnist"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "D2L_GPU_"))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(D2L_GPU_DATA=str(data), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.update(PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


@contextlib.contextmanager
def launched(cmd: list[str], env: dict, cwd: Path):
    """Start `cmd` in a session of its own; kill that whole process group on the way out."""
    proc = subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun's workers too, whatever happened
        proc.wait(timeout=10)


def run(cmd: list[str], env: dict, cwd: Path, *, check: bool = True) -> tuple[int, str]:
    """Run `cmd` to the end (at most TIMEOUT s); return (exit status, stdout+stderr)."""
    with launched(cmd, env, cwd) as proc:
        out, _ = proc.communicate(timeout=TIMEOUT)
    assert not check or proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{out}"
    return proc.returncode, out


def torchrun_local(nproc: int, *extra: str) -> list[str]:
    """torchrun on this machine with `nproc` workers and a c10d rendezvous on a free port.

    Not the static rendezvous (--master-port): it keeps one store across restarts, and restarted
    workers can read their dead predecessors' gloo addresses from it ("Connection refused").
    """
    return [*TORCHRUN, "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--local-addr", "127.0.0.1",
            *extra]  # fmt: skip


def load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def one_process(env, tmp_path_factory) -> dict:
    """Final parameters of a single process started without a launcher."""
    cwd = tmp_path_factory.mktemp("one")
    _, out = run([sys.executable, *SCRIPT, *ARGS, "--save", "final.pt"], env, cwd)
    assert "world size 1 (gloo, cpu)" in out and "epoch 2/2" in out, out
    return load(cwd / "final.pt")


@pytest.fixture(scope="module")
def two_ranks(env, tmp_path_factory) -> dict:
    """Final parameters of two ranks under torchrun, uninterrupted."""
    cwd = tmp_path_factory.mktemp("two")
    _, out = run([*torchrun_local(2), *SCRIPT, *ARGS, "--save", "final.pt"], env, cwd)
    assert "world size 2 (gloo, cpu)" in out and "global batch 32 = 2 x 16" in out, out
    return load(cwd / "final.pt")


@pytest.mark.slow
def test_two_ranks_equal_one_process(one_process, two_ranks):
    assert max_diff(one_process, two_ranks) < 1e-4


@pytest.mark.slow
def test_killed_rank_restarts_and_resumes(env, tmp_path, two_ranks):
    """SIGKILL rank 1 in epoch 2: torchrun restarts both ranks; they resume from epoch 1."""
    env = {**env, ddp.KILL_ENV: "2:3:1"}
    cmd = [*torchrun_local(2, "--max-restarts", "1"), *SCRIPT, *ARGS]
    _, out = run([*cmd, "--checkpoint", "ckpt.pt", "--save", "final.pt"], env, tmp_path)
    assert "rank 1 kills itself in epoch 2, step 3" in out, out
    assert "resumed from ckpt.pt: 1 of 2 epochs done" in out, out
    assert out.count("epoch 1/2:") == 1 and out.count("epoch 2/2:") == 1, out
    assert max_diff(load(tmp_path / "final.pt"), two_ranks) < 1e-6
    ckpt = load(tmp_path / "ckpt.pt")
    assert ckpt["epoch"] == 2 and ckpt["world_size"] == 2 and len(ckpt["rng"]) == 2
    assert not list(tmp_path.glob(".ckpt.pt.*.tmp"))


@pytest.mark.slow
def test_two_machines_one_job(env, tmp_path, one_process):
    """Two torchrun agents (--nnodes 2, one worker each) meet at a c10d rendezvous on 127.0.0.1."""
    port = free_port()
    agents = []
    with contextlib.ExitStack() as stack:
        for node_rank in (0, 1):
            cmd = [*TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", "--node-rank",
                   str(node_rank), "--rdzv-backend", "c10d", "--rdzv-endpoint",
                   f"127.0.0.1:{port}", "--rdzv-id", "d2l-test", "--local-addr", "127.0.0.1",
                   *SCRIPT, *ARGS, "--save", "final.pt"]  # fmt: skip
            agents.append(stack.enter_context(launched(cmd, env, tmp_path)))
        outs = [agent.communicate(timeout=TIMEOUT)[0] for agent in agents]
    assert all(a.returncode == 0 for a in agents), outs
    assert "world size 2 (gloo, cpu)" in "".join(outs), outs
    assert max_diff(load(tmp_path / "final.pt"), one_process) < 1e-4


# --- clear errors, checked in this process (a group of one needs no network) --------------------


@pytest.fixture
def lone(env, monkeypatch):
    """This process as a lone rank on the small data set."""
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", ddp.KILL_ENV):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("D2L_GPU_DATA", env["D2L_GPU_DATA"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


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
    assert ddp.main([*ARGS, *extra]) == 2
    assert message in capsys.readouterr().err


def test_checkpoint_errors(lone, tmp_path, capsys):
    path = str(tmp_path / "ckpt.pt")
    small = ["--epochs", "1", "--limit", "64", "--checkpoint", path]
    assert ddp.main([*ARGS, *small]) == 0
    assert ddp.main([*ARGS, *small, "--model", "resnet18"]) == 2
    assert "holds a lenet model, but this job trains resnet18" in capsys.readouterr().err
    ckpt = load(path)
    checkpoint.save_atomic({**ckpt, "world_size": 2}, path)
    assert ddp.main([*ARGS, *small]) == 2
    assert "written by a job of world size 2, but this job has world size 1" in (
        capsys.readouterr().err
    )
    Path(path).write_bytes(b"not a checkpoint")
    assert ddp.main([*ARGS, *small]) == 2
    assert "cannot be read" in capsys.readouterr().err


# --- pieces -------------------------------------------------------------------------------------


def test_shards_cover_each_global_batch_once():
    n, batch, world = 100, 12, 3
    per_epoch = []
    for epoch in range(2):
        shards = [ddp.shard_indices(n, batch, epoch, 7, r, world) for r in range(world)]
        assert all(s.shape == (n // batch, batch // world) for s in shards)
        whole = torch.cat(shards, dim=1)  # global batch i = rank 0's slice, rank 1's, ...
        assert len(whole.flatten().unique()) == n // batch * batch
        assert torch.equal(whole, ddp.shard_indices(n, batch, epoch, 7, 0, 1))
        per_epoch.append(whole)
    assert not torch.equal(per_epoch[0], per_epoch[1])  # reshuffled every epoch


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
def test_atomic_save_survives_sigkill(tmp_path, env):
    """A writer SIGKILLed after writing the new data, before the rename, leaves the old file."""
    path = tmp_path / "ckpt.pt"
    code = textwrap.dedent(f"""
        import os, signal, torch
        from d2l_gpu.checkpoint import save_atomic
        save_atomic({{"epoch": torch.tensor(1)}}, {str(path)!r})
        os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
        save_atomic({{"epoch": torch.tensor(2), "big": torch.zeros(10**6)}}, {str(path)!r})
    """)
    status, out = run([sys.executable, "-c", code], env, tmp_path, check=False)
    assert status == -signal.SIGKILL, out
    assert load(path)["epoch"] == 1
    assert len(list(tmp_path.glob(".ckpt.pt.*.tmp"))) == 1  # the dead writer's temporary file
    checkpoint.save_atomic({"epoch": torch.tensor(3)}, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]
    assert load(path)["epoch"] == 3
