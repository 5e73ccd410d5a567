"""Process groups: choosing a backend and device, joining and leaving a group (what the training
script does under torchrun), and launching torchrun privately on one machine (lessons 7 and 10-12).
`run_workers`, which starts k processes joined in a group from a notebook, is in workers.py.
"""

from __future__ import annotations

import gc
import importlib
import os
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from . import _checks
from ._typed import wrap_public
from .gloo import one_worker_thread
from .processes import children, ended, parent_gone

# the store this process joined its group through; dropped by leave_group
_STORE: dist.Store | None = None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that is free right now (the OS picks it)."""
    with socket.socket() as s:
        try:
            s.bind((host, 0))
        except (OSError, TypeError, UnicodeError) as e:
            raise ValueError(
                f"free_port: host {host!r} is no address of this machine ({e})"
            ) from None
        return s.getsockname()[1]


def pick_backend(world_size: int) -> str:
    """'nccl' when every rank can have a CUDA device of its own, else 'gloo' (CPU, any OS)."""
    _checks.whole("pick_backend: world_size", world_size)
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl" if dist.is_nccl_available() else "gloo"
    return "gloo"


def device_and_backend(
    local_rank: int, local_world: int, backend: str = "auto"
) -> tuple[torch.device, str]:
    """cuda:LOCAL_RANK with NCCL when each local rank has a GPU of its own, else gloo."""
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


class NeedsNewerTorch(RuntimeError):
    """A feature the PyTorch in use lacks, named in one sentence with the version it needs."""


def require_torch(major: int, minor: int, what: str) -> None:
    """Raise NeedsNewerTorch naming `what` unless PyTorch is major.minor or newer."""
    if torch_version() < (major, minor):
        raise NeedsNewerTorch(
            f"{what} needs PyTorch {major}.{minor} or newer; this is {torch.__version__}"
        )


def torch_at_least(major: int, minor: int, what: str) -> bool:
    """Whether PyTorch is major.minor or newer; if not, a sentence saying that the code using
    `what` is skipped (lessons 10, 11 and 14 on the oldest PyTorch admitted)."""
    try:
        require_torch(major, minor, what)
    except NeedsNewerTorch as e:
        print(f"skipped: {e}")
        return False
    return True


def dtensor_api():
    """torch.distributed.tensor (DTensor, Shard, Replicate, distribute_tensor), public from
    PyTorch 2.5; on 2.4 the same classes live in torch.distributed._tensor."""
    public = importlib.import_module("torch.distributed.tensor")
    if hasattr(public, "DTensor"):
        return public
    return importlib.import_module("torch.distributed._tensor")


def full_tensor(t):
    """The whole tensor behind `t` on the CPU (a DTensor shard is gathered, so every rank must
    call it); anything that is not a tensor comes back as it is. Lessons 7 and 11."""
    if not isinstance(t, torch.Tensor):
        return t
    if hasattr(t, "full_tensor"):
        Replicate = dtensor_api().Replicate  # noqa: N806

        for dim in range(len(t.placements)):  # one mesh dimension at a time: one gather each
            t = t.redistribute(placements=[Replicate()] * (dim + 1) + list(t.placements[dim + 1 :]))
        t = t.to_local()
    return t.detach().cpu().clone()


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
        with one_worker_thread():  # its collectives let go of their tensors in order
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
        groups = list(dist.distributed_c10d._world.pg_map)  # every group, the default first
        dist.destroy_process_group()
        if torch_version() < (2, 8):
            _NEVER_FREED.extend(groups)
    _STORE = None


# Before PyTorch 2.8 (pytorch#154976), Python frees a process group while holding the GIL, and
# the group's destructor joins its gloo threads. One of them may still be freeing a finished
# collective whose tensors need the GIL, and then both wait forever (seen on 2.4.1 in about one
# run in three of tests/test_context_parallel.py). On those versions leave_group keeps the groups
# here: their threads idle until the process ends, which run_workers' workers do through
# os._exit (multiprocessing) and the training script through end_process.
_NEVER_FREED: list = []


def end_at_once(code: int) -> None:
    """Flush stdout and stderr and exit with `code` now: no group, model or thread is freed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def end_process(code: int) -> None:
    """Exit with `code`; on PyTorch < 2.8 without freeing the groups (see _NEVER_FREED)."""
    if not _NEVER_FREED:
        sys.exit(code)
    end_at_once(code)


def end_with_parent(
    on_exit: Callable[[], None] | None = None, every: float = 0.2, caller: int | None = None
) -> None:
    """Exit this process, after `on_exit()`, as soon as the process that started it is gone.

    The workers of the training script that lesson 7 runs, and of `run_workers`, call it: a
    torchrun agent killed with SIGKILL, or a notebook kernel restarted, leaves its workers running
    unsupervised; a thread in each worker looks every `every` seconds whether it was handed to
    another parent, and ends the worker if so. `caller`: the process to watch instead, when a
    fork server, which outlives it, started this one on its behalf."""
    parent = os.getppid()
    if caller is not None and caller != parent:
        gone = partial(ended, caller)
    else:
        gone = partial(parent_gone, parent)

    def watch() -> None:
        while True:
            time.sleep(every)
            if gone():
                try:
                    if on_exit is not None:
                        on_exit()
                finally:
                    os._exit(1)

    threading.Thread(target=watch, name="end-with-parent", daemon=True).start()


def lost_contact(error: BaseException) -> bool:
    """True if `error` says that this rank lost its peers (a timeout or a broken connection).

    The training script that lesson 7 runs and `run_workers` ask it."""
    if isinstance(error, getattr(dist, "DistError", ())):  # DistBackendError, DistNetworkError
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        sign in text for sign in ("Timed out", "Connection reset", "Connection closed",
                                  "Connection refused", "Broken pipe", "Socket Timeout")
    )  # fmt: skip


def local_torchrun(
    nproc: int | None, *options: str, folder=None, rdzv_conf: dict | None = None
) -> tuple[list[str], dict]:
    """(command, extra environment) of torchrun for `nproc` workers on this machine, private.

    Shown in lesson 7 (with nproc None, `options` carry `--nproc-per-node N` themselves). The
    agents meet through a file (a c10d FileStore rendezvous) instead of a TCP port, and rank 0
    binds the job's store to 127.0.0.1, so nothing listens on the network. The file lives in
    `folder`, and so do torchrun's per-job log folders (`--log-dir`), so removing `folder` leaves
    nothing behind; without `folder`, torchrun makes both in the temporary folder and never removes
    them. `rdzv_conf` adds settings of the rendezvous (e.g. {"last_call_timeout": 15}: how long an
    elastic job waits for more machines once it has its minimum).
    """
    conf = ",".join(f"{k}={v}" for k, v in {"store_type": "file", **(rdzv_conf or {})}.items())
    where = []
    if folder is not None:
        job = os.urandom(6).hex()
        where = ["--rdzv-endpoint", str(Path(folder) / f"rdzv-{job}"),
                 "--log-dir", str(Path(folder) / "torchrun-logs")]  # fmt: skip
    count = [] if nproc is None else ["--nproc-per-node", str(nproc)]
    cmd = [sys.executable, "-m", "torch.distributed.run", *count, "--rdzv-backend", "c10d",
           "--rdzv-conf", conf, *where, "--local-addr", "127.0.0.1",
           *options]  # fmt: skip
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"  # gloo on the loopback interface (Linux)
    return cmd, env


def worker_pids(agent_pid: int) -> dict[int, int]:
    """{local rank: pid} of the workers that a torchrun agent started. Used by `kill_worker`.

    Linux reads each child's LOCAL_RANK from /proc; elsewhere the children are taken in the
    order they were started, which is the order of their local ranks.
    """
    kids = children(agent_pid)
    if not Path(f"/proc/{agent_pid}").exists():
        return dict(enumerate(kids))
    found = {}
    for child in kids:
        try:
            environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        env = dict(kv.split(b"=", 1) for kv in environ if b"=" in kv)
        if b"LOCAL_RANK" in env:
            found[int(env[b"LOCAL_RANK"])] = child
    return found


def all_reduce_together(tensors: list[torch.Tensor], mean: bool = False) -> None:
    """Sum (or average) each tensor over the group, in place, in one all-reduce of one buffer."""
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    if mean:
        flat /= dist.get_world_size()
    for t, part in zip(tensors, flat.split([t.numel() for t in tensors]), strict=True):
        t.copy_(part.view_as(t))


def rank_device(rank: int | None = None) -> torch.device:
    """This rank's device: cuda:(rank mod GPUs) when the group uses NCCL, otherwise the CPU.

    Shown in lesson 10; the workers of lessons 11 and 12 use it too.
    """
    if rank is not None:
        _checks.whole("rank_device: rank", rank, least=0)
    if dist.is_initialized() and dist.get_backend() == "nccl":
        rank = dist.get_rank() if rank is None else rank
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
