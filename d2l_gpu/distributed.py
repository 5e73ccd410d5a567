"""Several processes from one notebook or test: free ports, and `run_workers`, which starts k
processes joined in a process group, runs one function in each and returns what each returned.

Shown in lessons 9-11. Each worker is a fresh interpreter (the 'spawn' start method, the only
one on Windows and the default on macOS), so the function must be importable: defined in a
module (the package, or a file the notebook wrote), not in the notebook itself.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that is free right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def pick_backend(world_size: int) -> str:
    """'nccl' when every rank can have a CUDA device of its own, else 'gloo' (CPU, any OS)."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl" if dist.is_nccl_available() else "gloo"
    return "gloo"


def _worker(rank, fn, world_size, args, port, backend, outdir, threads) -> None:
    """One rank: join the group on 127.0.0.1:port, run fn, save its result (or the error)."""
    torch.set_num_threads(threads)
    if backend == "gloo" and Path("/sys/class/net/lo").exists():
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # stay on loopback (Linux)
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    out = Path(outdir) / f"rank{rank}.pt"
    result, phase = {}, "joining the group"
    try:
        dist.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
        )
        phase = "running"
        result = {"ok": fn(rank, world_size, *args)}
        phase = "leaving the group"
        dist.barrier()  # nobody tears down while another rank still talks to it
    except BaseException:  # noqa: BLE001 - sent to the parent, which raises it
        result = {"error": traceback.format_exc(), "phase": phase}
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    tmp = out.with_suffix(".tmp")
    torch.save(result, tmp)
    os.replace(tmp, out)


def run_workers(
    fn: Callable,
    world_size: int,
    *args,
    backend: str = "auto",
    timeout: float = 300.0,
    threads: int = 1,
) -> list:
    """Run `fn(rank, world_size, *args)` in `world_size` processes; return each rank's result."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if getattr(fn, "__module__", "__main__") == "__main__":
        raise ValueError(
            f"{getattr(fn, '__name__', fn)!r} is defined in the notebook or script itself; a new "
            "process cannot import it. Put it in a .py file (e.g. with %%writefile) and import it"
        )
    backend = pick_backend(world_size) if backend == "auto" else backend
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="d2l-workers-") as outdir:
        port = free_port()
        procs = [
            ctx.Process(
                target=_worker,
                args=(rank, fn, world_size, args, port, backend, outdir, threads),
                daemon=True,
            )
            for rank in range(world_size)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        try:
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
        finally:
            for p in procs:  # whatever happened, no worker outlives the call
                if p.is_alive():
                    p.kill()
                    p.join()
        results, errors = [], []
        for rank, p in enumerate(procs):
            path = Path(outdir) / f"rank{rank}.pt"
            if not path.exists():
                why = "did not finish" if p.exitcode is None or p.exitcode < 0 else "failed"
                raise RuntimeError(
                    f"rank {rank} of {world_size} {why} (exit code {p.exitcode}) within "
                    f"{timeout:.0f} s; run with a larger timeout= or fewer ranks"
                )
            result = torch.load(path, weights_only=False)  # written by our own worker just now
            if "error" in result:
                errors.append((result["phase"] != "running", rank, result["error"]))
            else:
                results.append(result["ok"])
        if errors:  # the first rank whose own code failed; the others only lost their peer
            _, rank, error = min(errors)
            raise RuntimeError(f"rank {rank} of {world_size} raised:\n{error}")
        return results
