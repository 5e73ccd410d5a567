"""Process groups: choosing a backend and device, joining and leaving a group (what the training
script does under torchrun), launching torchrun privately on one machine, and `run_workers`,
which starts k processes joined in a group from a notebook or test (lessons 7 and 9-11).

Each worker of `run_workers` is a fresh interpreter (the 'spawn' start method, the only one on
Windows and the default on macOS), so the function must be importable: defined in a module (the
package, or a file the notebook wrote), not in the notebook itself.
"""

from __future__ import annotations

import gc
import importlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

_STORE = None  # the store this process joined its group through; dropped by leave_group


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that is free right now (the OS picks it). Shown in lesson 7."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def pick_backend(world_size: int) -> str:
    """'nccl' when every rank can have a CUDA device of its own, else 'gloo' (CPU, any OS)."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl" if dist.is_nccl_available() else "gloo"
    return "gloo"


def device_and_backend(
    local_rank: int, local_world: int, backend: str = "auto"
) -> tuple[torch.device, str]:
    """cuda:LOCAL_RANK with NCCL when each local rank has a GPU of its own, else gloo (lesson 7)."""
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "nccl" or (backend == "auto" and n >= local_world):
        if n <= local_rank:
            raise ValueError(
                f"NCCL needs a CUDA device per rank; local rank {local_rank}, {n} GPUs"
            )
        return torch.device("cuda", local_rank), "nccl"
    if n:  # gloo on GPUs that several ranks share
        return torch.device("cuda", local_rank % n), "gloo"
    return torch.device("cpu"), "gloo"


def torch_version() -> tuple[int, int]:
    """(major, minor) of the PyTorch in use (the training script of lesson 7 checks it)."""
    return tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])  # type: ignore


def _store_bound_to(host: str, port: int, world: int, timeout: timedelta):
    """A TCPStore server listening on `host` only (not on every interface, PyTorch's default)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    fd = sock.detach()  # the store owns the socket from here on
    # PyTorch's libuv store takes over a listening socket from 2.8 on; the older store earlier
    options = {} if torch_version() >= (2, 8) else {"use_libuv": False}
    try:
        return dist.TCPStore(host, port, world, is_master=True, timeout=timeout,
                             wait_for_workers=False, master_listen_fd=fd, **options)  # fmt: skip
    except TypeError:  # a PyTorch without master_listen_fd
        os.close(fd)
        warnings.warn(
            f"PyTorch {torch.__version__} cannot bind the store to {host}: it listens on every "
            "network interface; keep the port private (firewall) or use PyTorch 2.8 or newer",
            stacklevel=2,
        )
        return dist.TCPStore(host, port, world, is_master=True, timeout=timeout)


def join_group(backend: str, device: torch.device, timeout_s: float = 1800) -> tuple[int, int]:
    """Join the job's group from torchrun's variables, or form a group of one; (rank, world).

    Shown in lesson 7. Under `torchrun` with `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` (what
    `local_torchrun` sets), rank 0 hosts the job's store on MASTER_ADDR only.
    """
    global _STORE
    # torch._dynamo (which DDP, FSDP and the pipeline import on first use) keeps a reference to
    # the default group when it is first imported after the group exists (seen in PyTorch
    # 2.13): destroy_process_group then cannot free the group, whose gloo threads run on into
    # interpreter shutdown, where releasing a tensor needs the GIL and aborts the process.
    importlib.import_module("torch._dynamo")
    nccl_device = device if backend == "nccl" else None
    timeout = timedelta(seconds=timeout_s)
    if "MASTER_ADDR" not in os.environ:  # a lone process: a group of one, no network
        _STORE = dist.HashStore()
        dist.init_process_group(backend, store=_STORE, rank=0, world_size=1)
        return 0, 1
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        store = _store_bound_to(host, port, world, timeout)
    else:  # the store of rank 0, or of torchrun's agent
        store = dist.TCPStore(host, port, world, is_master=False, timeout=timeout)
    # an agent's store outlives a restart: each attempt gets fresh keys, or new ranks may read
    # their dead predecessors' gloo addresses ("Connection refused")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    _STORE = dist.PrefixStore(f"d2l_gpu/attempt{attempt}", store)
    dist.init_process_group(
        backend, store=_STORE, rank=rank, world_size=world, timeout=timeout, device_id=nccl_device
    )
    return rank, world


def leave_group() -> None:
    """Tear the group down for good, its threads included, while Python is still whole.

    Shown in lesson 7. Models wrapped for the group (DDP keeps reference cycles) are freed
    first, so that destroy_process_group drops the last reference and the group's threads
    are joined here, not left to run into interpreter shutdown."""
    global _STORE
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
    _STORE = None


def lost_contact(error: BaseException) -> bool:
    """True if `error` says that this rank lost its peers (a timeout or a broken connection).

    Shown in lesson 7."""
    if isinstance(error, getattr(dist, "DistError", ())):  # DistBackendError, DistNetworkError
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        sign in text for sign in ("Timed out", "Connection reset", "Connection closed",
                                  "Connection refused", "Broken pipe", "Socket Timeout")
    )  # fmt: skip


def local_torchrun(nproc: int, *options: str, folder=None) -> tuple[list[str], dict]:
    """(command, extra environment) of torchrun for `nproc` workers on this machine, private.

    Shown in lesson 7. The agents meet through a file (a c10d FileStore rendezvous) instead of a
    TCP port, and rank 0 binds the job's store to 127.0.0.1, so nothing listens on the network.
    The file lives in `folder` (else torchrun makes a private temporary one).
    """
    where = (
        []
        if folder is None
        else ["--rdzv-endpoint", str(Path(folder) / f"rdzv-{os.urandom(6).hex()}")]
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--rdzv-backend", "c10d", "--rdzv-conf", "store_type=file", *where,
           "--local-addr", "127.0.0.1", *options]  # fmt: skip
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"  # gloo on the loopback interface (Linux)
    return cmd, env


def worker_pids(agent_pid: int) -> dict[int, int]:
    """{local rank: pid} of the workers that a torchrun agent started. Shown in lesson 7.

    Linux reads each child's LOCAL_RANK from /proc; elsewhere the children are taken in the
    order they were started (by process id), which is the order of their local ranks.
    """
    if Path(f"/proc/{agent_pid}").exists():
        found = {}
        for task in Path(f"/proc/{agent_pid}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in children:
                try:
                    environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                env = dict(kv.split(b"=", 1) for kv in environ if b"=" in kv)
                if b"LOCAL_RANK" in env:
                    found[int(env[b"LOCAL_RANK"])] = int(child)
        return found
    out = subprocess.run(["ps", "-A", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    pids = sorted(
        int(p) for p, pp in (line.split() for line in out.splitlines()) if int(pp) == agent_pid
    )
    return dict(enumerate(pids))


def _worker(rank, fn, world_size, args, store, backend, outdir, threads) -> None:
    """One rank: join the group through the file `store`, run fn, save its result (or error)."""
    torch.set_num_threads(threads)
    if backend == "gloo" and Path("/sys/class/net/lo").exists():
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # stay on loopback (Linux)
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    out = Path(outdir) / f"rank{rank}.pt"
    result, phase = {}, "joining the group"
    try:
        importlib.import_module("torch._dynamo")  # before the group exists: see join_group
        dist.init_process_group(
            backend, init_method=Path(store).as_uri(), rank=rank, world_size=world_size
        )
        phase = "running"
        result = {"ok": fn(rank, world_size, *args)}
        phase = "leaving the group"
        dist.barrier()  # nobody tears down while another rank still talks to it
    except BaseException:  # noqa: BLE001 - sent to the parent, which raises it
        result = {"error": traceback.format_exc(), "phase": phase}
    finally:
        leave_group()  # the group's threads are joined here, not at interpreter shutdown
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
    """Run `fn(rank, world_size, *args)` in `world_size` processes; return each rank's result.

    Shown in lessons 9-11. The processes meet through a file in a private temporary folder, so
    no network port is opened for the rendezvous.
    """
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
        store = str(Path(outdir) / "store")
        procs = [
            ctx.Process(
                target=_worker,
                args=(rank, fn, world_size, args, store, backend, outdir, threads),
                daemon=True,
            )
            for rank in range(world_size)
        ]
        # The workers' C++ warnings (e.g. the profiler's notes about memory allocated before it
        # started) would land, at random, in the notebook's output: children log errors only.
        saved = os.environ.get("TORCH_CPP_LOG_LEVEL")
        os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
        try:
            for p in procs:
                p.start()
        finally:
            if saved is None:
                os.environ.pop("TORCH_CPP_LOG_LEVEL", None)
            else:
                os.environ["TORCH_CPP_LOG_LEVEL"] = saved
        deadline = time.monotonic() + timeout
        try:
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
        finally:
            for p in procs:  # whatever happened, no worker outlives the call
                if p.is_alive():
                    p.kill()
                    p.join()
        return _collect(procs, outdir, world_size, timeout)


def _collect(procs, outdir, world_size: int, timeout: float) -> list:
    """Each rank's result in rank order, or a RuntimeError naming the rank that failed first."""
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


def rank_device(rank: int | None = None) -> torch.device:
    """This rank's device: cuda:(rank mod GPUs) when the group uses NCCL, otherwise the CPU.

    Shown in lessons 9-11.
    """
    if dist.is_initialized() and dist.get_backend() == "nccl":
        rank = dist.get_rank() if rank is None else rank
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")
