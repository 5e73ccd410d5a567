"""Run many short two-rank torchrun jobs of the training script and count the ones that fail.

    python scripts/stress_ddp.py [-n 40] [-j 2] [--restart] [--cores DIR] [--module M]

Each job trains LeNet for 2 epochs on a small random Fashion-MNIST-format data set (2 ranks, gloo,
on this machine only), with a checkpoint and a saved model, in a folder of its own, in a session
of its own that is killed when the job ends or runs past --timeout. With --restart, every job also
kills rank 1 from outside once the epoch-1 checkpoint exists and lets `torchrun --max-restarts 1`
resume. Prints how many of N jobs exited non-zero (and how), and exits 1 if any did. With --cores
DIR, failing workers may dump core (RLIMIT_CORE) and the folders of failed jobs are kept in DIR.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: import this checkout's d2l_gpu

from d2l_gpu._checks import count_arg, positive_arg  # noqa: E402
from d2l_gpu.distributed import free_port, local_torchrun  # noqa: E402


def write_data(folder: Path, n_train: int = 256, n_test: int = 64) -> None:
    """Four small Fashion-MNIST-format IDX files of random images and labels."""
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        head = np.array([0x803, n, 28, 28], dtype=">u4").tobytes()
        (folder / f"{split}-images-idx3-ubyte").write_bytes(head + images.tobytes())
        head = np.array([0x801, n], dtype=">u4").tobytes()
        (folder / f"{split}-labels-idx1-ubyte").write_bytes(head + labels.tobytes())


def _allow_cores() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def one_job(i: int, args, data: Path, base: Path) -> dict:
    """Run job i in a folder of its own; return its exit status and the interesting lines."""
    work = base / f"job{i:03d}"
    work.mkdir()
    restarts = ["--max-restarts", "1" if args.restart else "0"]
    if args.launcher == "tcp":  # the c10d rendezvous on a TCP port, as lesson 7 had it first
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
               "--local-addr", "127.0.0.1", "--log-dir", str(work / "torchrun-logs"),
               *restarts]  # fmt: skip
        env = {"GLOO_SOCKET_IFNAME": "lo"} if Path("/sys/class/net/lo").exists() else {}
    else:
        cmd, env = local_torchrun(2, *restarts, folder=work)
    cmd += ["-m", args.module, "--epochs", "2", "--batch-size", "32", "--lr", "0.1"]
    cmd += ["--checkpoint", "ckpt.pt", "--save", "final.pt", "--strategy", args.strategy]
    env = {**os.environ, **env, "D2L_GPU_DATA": str(data), "OMP_NUM_THREADS": "1"}
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")
    tic = time.monotonic()
    with open(work / "log.txt", "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=_allow_cores if args.cores else None,
        )  # fmt: skip
        try:
            if args.restart:
                _kill_rank_after_checkpoint(proc, work, args.timeout)
            status = proc.wait(timeout=max(1.0, args.timeout - (time.monotonic() - tic)))
        except subprocess.TimeoutExpired:
            status = "timeout"
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    text = (work / "log.txt").read_text(errors="replace")
    why = sorted(
        set(re.findall(r"terminate called[^\n]*|exitcode: -?\d+|Signal \d+ \(\w+\)", text))
    )
    failed = status != 0 or not (work / "final.pt").exists()
    if failed and args.cores:
        shutil.copytree(work, Path(args.cores) / work.name, dirs_exist_ok=True)
    return {"job": i, "status": status, "failed": failed, "why": why,
            "seconds": time.monotonic() - tic}  # fmt: skip


def _kill_rank_after_checkpoint(proc, work: Path, timeout: float) -> None:
    """SIGKILL the worker of rank 1 once the epoch-1 checkpoint is on disk (first attempt)."""
    from d2l_gpu.distributed import worker_pids  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if (work / "ckpt.pt").exists():
            pids = worker_pids(proc.pid)
            if 1 in pids:
                os.kill(pids[1], signal.SIGKILL)
            return
        time.sleep(0.05)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--jobs", type=count_arg, default=40, help="number of jobs (40)")
    p.add_argument("-j", "--parallel", type=count_arg, default=2, help="jobs at the same time (2)")
    p.add_argument("--module", default="d2l_gpu.train", help="script to run (d2l_gpu.train)")
    p.add_argument("--launcher", choices=["private", "tcp"], default="private",
                   help="rendezvous: a private file (default) or c10d on a TCP port")  # fmt: skip
    p.add_argument("--restart", action="store_true", help="kill rank 1 after epoch 1, resume")
    p.add_argument("--strategy", choices=["ddp", "fsdp", "pipeline"], default="ddp",
                   help="the script's --strategy (ddp)")  # fmt: skip
    p.add_argument("--timeout", type=positive_arg, default=180, help="seconds per job (180)")
    p.add_argument("--cores", metavar="DIR", help="allow core dumps; keep failed jobs in DIR")
    args = p.parse_args(argv)
    if args.jobs < 1 or args.parallel < 1:
        p.error("-n and -j must be at least 1")
    with tempfile.TemporaryDirectory(prefix="d2l-stress-") as tmp:
        base = Path(tmp)
        data = base / "data"
        data.mkdir()
        write_data(data)
        tic = time.monotonic()
        with ThreadPoolExecutor(args.parallel) as pool:
            results = list(pool.map(lambda i: one_job(i, args, data, base), range(args.jobs)))
        elapsed = time.monotonic() - tic
    failed = [r for r in results if r["failed"]]
    for r in failed:
        print(f"job {r['job']}: exit status {r['status']} {'; '.join(r['why'])}")
    median = sorted(r["seconds"] for r in results)[len(results) // 2]
    kind = "restarted " if args.restart else ""
    print(
        f"{len(failed)} of {len(results)} {kind}two-rank jobs ({args.module}, {args.strategy}) "
        "exited non-zero "
        f"({args.parallel} at a time, median {median:.1f} s per job, {elapsed:.0f} s in all)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
