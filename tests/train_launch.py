"""Launching the training script from the tests (test_train_*.py): sessions killed on the way out.

Every process runs on 127.0.0.1 with gloo, on a small synthetic Fashion-MNIST in the real IDX
format (D2L_GPU_DATA). Each launch has a time limit and runs in a session of its own, whose whole
process group is killed when the test ends, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from d2l_gpu.distributed import local_torchrun
from d2l_gpu.jobs import kill_worker

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ["-m", "d2l_gpu.train"]
BATCH = 32  # 256 training examples: 8 steps per epoch
ARGS = ["--model", "lenet", "--epochs", "2", "--batch-size", str(BATCH), "--lr", "0.1"]
ARGS += ["--seed", "3"]
ARGS64 = [*ARGS, "--dtype", "float64"]  # exactness over 16 steps: float64, any machine
TIMEOUT = 120


def job_env(data: Path) -> dict:
    """Environment of launched jobs: small data, one thread, loopback, no stray ranks."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "D2L_GPU_"))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(D2L_GPU_DATA=str(data), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.update(PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


@contextlib.contextmanager
def launched(cmd: list[str], env: dict, cwd: Path, **popen):
    """Start `cmd` in a session of its own; kill that whole process group on the way out."""
    proc = subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, **popen,
    )  # fmt: skip
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun's workers too, whatever happened
        proc.communicate(timeout=30)


def run(cmd: list[str], env: dict, cwd: Path, *, check: bool = True) -> tuple[int, str]:
    """Run `cmd` to the end (at most TIMEOUT s); return (exit status, stdout+stderr)."""
    with launched(cmd, env, cwd) as proc:
        out, _ = proc.communicate(timeout=TIMEOUT)
    assert not check or proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{out}"
    return proc.returncode, out


def run_here(args: list[str], env: dict, cwd: Path, monkeypatch) -> None:
    """The job as one process in this interpreter (a group of one), on `env`'s data, in `cwd`.

    What `python -m d2l_gpu.train ARGS` computes, without starting an interpreter and importing
    torch again (about 4 s here, most of a small job); the float64 results agree to 1e-12.
    """
    from d2l_gpu import train

    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("D2L_GPU_DATA", env["D2L_GPU_DATA"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.chdir(cwd)
    assert train.main(args) == 0, args


def run_forked(nproc: int, args: list[str], env: dict, cwd: Path) -> tuple[int, str]:
    """`python -m d2l_gpu.train ARGS` on `nproc` ranks forked from a server that imported PyTorch
    once (d2l_gpu.workers' fork server); (the worst exit status, every rank's output in order).

    For the tests whose property is the strategy's arithmetic (k ranks = 1 process), not the
    launcher's: torchrun starts each rank as a new interpreter, and the imports (PyTorch, and
    torch._dynamo that DDP and FSDP load) took most of such a test's 10 s here. Each rank runs
    the script's own `main` with the variables torchrun would set (RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT), rank 0 hosting the job's store, as under `d2l_gpu.torchrun`. Jobs that need
    torchrun's agent (a restart after a kill, the elastic rendezvous) use `torchrun` below.
    A rank that fails ends the others, as torchrun does; the whole job has TIMEOUT seconds.
    """
    from d2l_gpu.distributed import free_port
    from d2l_gpu.workers import _context

    ctx, port = _context(), free_port()
    logs = [cwd / f".rank{rank}.log" for rank in range(nproc)]
    procs = [
        ctx.Process(target=_train_rank, args=(rank, nproc, port, args, env, cwd, logs[rank]))
        for rank in range(nproc)
    ]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + TIMEOUT
    killed = set()
    try:
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
            if any(p.exitcode not in (None, 0) for p in procs):
                break  # a rank failed: the others would wait for it until their timeout
            time.sleep(0.02)
    finally:
        for rank, proc in enumerate(procs):
            if proc.is_alive():
                proc.kill()
                killed.add(rank)
            proc.join()
    out = "".join(log.read_text() for log in logs if log.exists())
    for log in logs:
        log.unlink(missing_ok=True)
    # the status of a rank that ended by itself, not of one ended here because another failed
    ended = [p.exitcode for rank, p in enumerate(procs) if rank not in killed]
    code = next((c for c in ended if c != 0), -9 if killed else 0)
    return code, out


def _train_rank(rank: int, world: int, port: int, args: list[str], env: dict, cwd: Path,
                log: Path) -> None:  # fmt: skip
    """One rank of `run_forked`: torchrun's variables, output to `log`, the script's main."""
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))  # fmt: skip
    os.chdir(cwd)
    torch.set_num_threads(1)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    from d2l_gpu import train

    code = 1
    try:
        code = train.main(args)
    except SystemExit as e:  # argparse's exit on a bad flag
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # no interpreter shutdown: what a finished rank has left to do is done


def torchrun(nproc: int, env: dict, folder: Path, *options: str) -> tuple[list[str], dict]:
    """The private one-machine torchrun command for `nproc` workers, and its environment."""
    cmd, extra = local_torchrun(nproc, *options, folder=folder)
    return cmd, {**env, **extra}


def kill_rank_when(proc, path: Path, rank: int = 1, timeout: float = TIMEOUT) -> None:
    """SIGKILL worker `rank` of the torchrun agent `proc` once `path` (or its temporary) appears.

    `d2l_gpu.jobs.kill_worker` pauses the other workers around the kill, so that the job cannot
    get past the next epoch between seeing the file and the kill, however loaded the machine is:
    the restarted job resumes from exactly this checkpoint.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() or list(path.parent.glob(f".{path.name}.*.tmp")):
            if kill_worker(proc.pid, rank):
                return
        time.sleep(0.005)
    raise AssertionError(f"{path} did not appear, or rank {rank} was not found, in time")


def load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def run_with_a_kill(make_cmd, folder: Path, rank: int = 1, trials: int = 3):
    """Run the job make_cmd(subfolder) -> (cmd, env), SIGKILLing worker `rank` once ckpt.pt
    appears; (returncode, output, subfolder) of the first trial in which the kill counted.

    An epoch of the test jobs takes about 0.2 s. If this process is not scheduled between the
    epoch-1 checkpoint and the end of the job, the kill lands on a rank that has already done
    its work (seen once in ten CI runs): such a trial tests nothing and is run again in a fresh
    folder. A job that finishes without resuming every time still fails the caller's checks.
    """
    for trial in range(trials):
        sub = folder / f"trial{trial}"
        sub.mkdir()
        cmd, env = make_cmd(sub)
        with launched(cmd, env, sub) as proc:
            kill_rank_when(proc, sub / "ckpt.pt", rank=rank)
            out, _ = proc.communicate(timeout=TIMEOUT)
        if "resumed from" in out or "saved the final model" not in out:
            break
    return proc.returncode, out, sub
