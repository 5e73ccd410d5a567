"""`run_workers`: k processes joined in one process group, started from a notebook or a test, with
their results back in rank order. Shown in lessons 10-12.

Each worker is a new process that shares nothing with the caller, so the function must be
importable: defined in a module (the package, or a file the notebook wrote), not in the notebook
itself. On Linux the workers are forked from a server process that imported PyTorch once (the
'forkserver' start method): a call then starts its ranks in a fraction of a second instead of the
seconds each fresh interpreter needs to import PyTorch. Elsewhere each worker is a fresh
interpreter ('spawn', the only method on Windows; macOS frameworks are not safe to fork).

What goes wrong is said in one sentence that names the rank whose own code failed, with its
exception and the line it came from:

- a rank that only lost its peer (a connection closed while it waited in a collective) is ranked
  below one whose own code raised, so the report blames the rank that caused it;
- a crash (a segfault, `os._exit`, gloo aborting on tensors of different sizes) is reported as a
  crash, with its exit code or signal and the last lines the rank wrote to stderr; a timeout is
  reported as a timeout, with the ranks still running;
- a rank that prints more than 2**20 characters is cut there, with one line naming it
  (d2l_gpu._capped);
- if the calling process dies (a kernel restart, a SIGKILL), every worker notices within a fraction
  of a second, removes the job's temporary folder and exits: nothing is left behind (the fork
  server sees its caller's end and exits first, and the workers see theirs).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ._capped import cap_stdout
from ._typed import wrap_public
from .distributed import end_with_parent, leave_group, lost_contact, pick_backend
from .gloo import one_worker_thread
from .processes import pid_alive

BACKENDS = ("auto", "gloo", "nccl", "mpi", "xccl")
WATCH_EVERY = 0.2  # seconds between a worker's looks at whether its parent is still alive
# what the fork server imports once, before any group exists (see join_group on torch._dynamo)
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "d2l_gpu.workers"]
_WATCHED: set[int] = set()  # the fork servers a thread waits on


def _context():
    """The start method: 'forkserver' on Linux (PyTorch imported once), else 'spawn'."""
    if sys.platform != "linux":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    atexit.unregister(_stop_fork_server)  # registered once, however many calls
    atexit.register(_stop_fork_server)
    return ctx


def _watch_fork_server() -> None:
    """Reap the fork server as soon as it ends (see `_reap`), watched once per server."""
    from multiprocessing import forkserver

    server = forkserver._forkserver  # the standard library's one server per process
    pid = server._forkserver_pid
    if pid is not None and pid not in _WATCHED:
        _WATCHED.add(pid)
        threading.Thread(target=_reap, args=(server, pid), daemon=True).start()


def _reap(server, pid: int) -> None:
    """Wait until the fork server `pid` has ended, then reap it under the server's own lock.

    A Jupyter kernel, at shutdown, terminates its children and waits until none is left: a
    server it ended and nobody reaped stayed a zombie, so Jupyter killed the kernel after 5 s.
    Reaped here, its CPU time (and its workers') counts as the kernel's children's.
    """
    with contextlib.suppress(ChildProcessError):  # already reaped (by a stop at exit)
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # ended, not yet reaped
    with server._lock:
        if server._forkserver_pid == pid:  # not relaunched meanwhile: forget it as _stop does
            with contextlib.suppress(OSError):
                server._stop_unlocked()


def _stop_tracker_in_kernel() -> None:
    """In a Jupyter kernel, once the workers have ended, stop multiprocessing's resource tracker
    (the next call starts a new one in a few milliseconds): at shutdown the kernel terminates
    its children and waits until none is left, and the tracker ignores SIGTERM, so Jupyter
    killed the kernel after 5 s."""
    from multiprocessing import resource_tracker

    if _in_kernel():
        with contextlib.suppress(Exception):  # a private method of the standard library's
            resource_tracker._resource_tracker._stop()


def _in_kernel() -> bool:
    """Whether this process is a Jupyter kernel (not merely a process that imported ipykernel)."""
    app = sys.modules.get("ipykernel.kernelapp")
    return app is not None and app.IPKernelApp.initialized()


def _stop_fork_server() -> None:
    """At exit, end the fork server and wait for it: it is reaped by this process, so its CPU
    time and its workers' count as this process's children's (as spawned workers' do)."""
    from multiprocessing import forkserver

    with contextlib.suppress(Exception):  # a private method of the standard library's server
        forkserver._forkserver._stop()


def _student_frame(tb) -> str:
    """'file:line in function' of the innermost frame outside torch and this package."""
    here = str(Path(__file__).parent)
    frames = [
        f
        for f in traceback.extract_tb(tb)
        if "torch" not in Path(f.filename).parts and here not in f.filename
    ]
    return f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else "?"


def _worker(rank, fn, world_size, args, store, backend, outdir, threads, env, caller) -> None:
    """One rank: join the group through the file `store`, run fn, save its result (or error)."""
    os.environ.clear()  # the caller's environment now, as a fresh interpreter would see it
    os.environ.update(env)
    cleanup = partial(shutil.rmtree, outdir, ignore_errors=True)
    end_with_parent(cleanup, every=WATCH_EVERY, caller=caller)
    err = os.open(Path(outdir) / f"rank{rank}.err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(err, 2)  # the rank's stderr, quoted in the report if it crashes
    cap_stdout(rank)  # a rank printing in a loop is cut after 2**20 characters, said once
    torch.set_num_threads(threads)
    if backend == "gloo" and Path("/sys/class/net/lo").exists():
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # stay on loopback (Linux)
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    out = Path(outdir) / f"rank{rank}.pt"
    result, phase = {}, "joining the group"
    try:
        importlib.import_module("torch._dynamo")  # before the group exists: see join_group
        # the imports' objects live until this process ends: collections skip them from now on
        # (a full collection, which a memory measurement makes, then takes 1 ms, not 80)
        gc.freeze()
        with one_worker_thread():  # gloo's collectives let go of their tensors in order
            dist.init_process_group(
                backend, init_method=Path(store).as_uri(), rank=rank, world_size=world_size
            )
        phase = "running"
        result = {"ok": fn(rank, world_size, *args)}
        phase = "leaving the group"
        dist.barrier()  # nobody tears down while another rank still talks to it
    except BaseException as e:  # noqa: BLE001 - sent to the parent, which raises it
        result = {
            "error": traceback.format_exc(),
            "phase": phase,
            "what": f"{type(e).__name__}: {e}".strip(),
            "where": _student_frame(e.__traceback__),
            "lost_peer": isinstance(e, Exception) and lost_contact(e),
        }
    finally:
        leave_group()  # the group's threads are joined here, not at interpreter shutdown
    tmp = out.with_suffix(".tmp")
    try:
        torch.save(result, tmp)
    except Exception as e:  # noqa: BLE001 - e.g. a lambda or an open file returned by fn
        what = f"its return value cannot be sent back to the caller ({type(e).__name__}: {e})"
        torch.save({"error": what, "phase": "returning", "what": what, "where": "?"}, tmp)
    os.replace(tmp, out)


def _check_arguments(fn, world_size, backend, timeout, threads) -> None:
    if not callable(fn):
        raise TypeError(f"run_workers: fn must be a function, not {type(fn).__name__}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"run_workers: world_size must be a whole number >= 1, got {world_size!r}")
    if backend not in BACKENDS:
        raise ValueError(
            f"run_workers: backend must be one of {', '.join(BACKENDS)}, not {backend!r}"
        )
    if backend == "nccl" and torch.cuda.device_count() == 0:
        raise ValueError(
            "run_workers: backend='nccl' needs CUDA GPUs and none is visible; use 'gloo'"
        )
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(
            f"run_workers: timeout must be a positive number of seconds, got {timeout!r}"
        )
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"run_workers: threads must be a whole number >= 1, got {threads!r}")
    if getattr(fn, "__module__", "__main__") == "__main__":
        raise ValueError(
            f"{getattr(fn, '__name__', fn)!r} is defined in the notebook or script itself; a new "
            "process cannot import it. Put it in a .py file (e.g. with %%writefile) and import it"
        )


def _remove_stale_folders() -> None:
    """Remove the folders of earlier calls whose process died before it could (a backstop)."""
    for folder in Path(tempfile.gettempdir()).glob("d2l-workers-*-*"):
        try:
            owner = int(folder.name.split("-")[2])
        except (ValueError, IndexError):
            continue
        if not pid_alive(owner):  # never os.kill(owner, 0): on Windows that is no question
            shutil.rmtree(folder, ignore_errors=True)


def run_workers(
    fn: Callable,
    world_size: int,
    *args,
    backend: str = "auto",
    timeout: float = 300.0,
    threads: int = 1,
) -> list:
    """Run `fn(rank, world_size, *args)` in `world_size` processes; return each rank's result.

    Shown in lessons 8 and 10-12. The processes meet through a file in a private temporary
    folder, so no network port is opened for the rendezvous. A gloo group runs one worker thread
    (d2l_gpu.gloo): collectives one after the other, as the workers call them.
    """
    _check_arguments(fn, world_size, backend, timeout, threads)
    backend = pick_backend(world_size) if backend == "auto" else backend
    _remove_stale_folders()
    ctx = _context()
    env, caller = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"}, os.getpid()
    with tempfile.TemporaryDirectory(prefix=f"d2l-workers-{os.getpid()}-") as outdir:
        store = str(Path(outdir) / "store")

        def make(ctx) -> list:
            return [
                ctx.Process(
                    target=_worker,
                    args=(rank, fn, world_size, args, store, backend, outdir, threads, env, caller),
                    daemon=True,
                )
                for rank in range(world_size)
            ]

        procs = make(ctx)
        # The workers' C++ warnings (e.g. the profiler's notes about memory allocated before it
        # started) would land, at random, in the notebook's output: children log errors only.
        saved = os.environ.get("TORCH_CPP_LOG_LEVEL")
        os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
        try:
            try:
                procs[0].start()
                if ctx.get_start_method() == "forkserver":
                    _watch_fork_server()
            except OSError:  # no fork server (e.g. its socket's path under TMPDIR is too long)
                procs = make(mp.get_context("spawn"))
                procs[0].start()
            for p in procs[1:]:
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
            running = [rank for rank, p in enumerate(procs) if p.is_alive()]
        finally:
            for p in procs:  # whatever happened, no worker outlives the call
                if p.is_alive():
                    p.kill()
                    p.join()
            _stop_tracker_in_kernel()
        return _collect(procs, outdir, world_size, timeout, running)


# gloo's words for it, and on PyTorch 2.4 (where gloo aborts the process) its check's
_MISMATCH = ("Received data size doesn't match expected size", "op.preamble.length <= op.nbytes")


def _crash(rank: int, world_size: int, exitcode: int | None, outdir: str) -> str:
    """The sentence for a rank that ended without a result."""
    if exitcode is not None and exitcode < 0:
        try:
            how = f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"was killed by signal {-exitcode}"
    else:
        how = f"exited with code {exitcode} before returning"
    err = Path(outdir) / f"rank{rank}.err"
    lines = err.read_text(errors="replace").strip().splitlines()[-8:] if err.exists() else []
    said = ("; its last lines on stderr:\n  " + "\n  ".join(lines)) if lines else ""
    if any(words in line for words in _MISMATCH for line in lines):
        said += (
            "\nThe ranks passed tensors of different sizes (or dtypes) to one message or "
            "collective: give that call the same shape and dtype on every rank."
        )
    return f"rank {rank} of {world_size} crashed: it {how}{said}"


def _collect(procs, outdir, world_size: int, timeout: float, running: list[int]) -> list:
    """Each rank's result in rank order, or a RuntimeError naming the rank that failed first."""
    results, errors, crashed = [], [], []
    for rank, p in enumerate(procs):
        path = Path(outdir) / f"rank{rank}.pt"
        if not path.exists():
            if rank not in running:
                crashed.append(_crash(rank, world_size, p.exitcode, outdir))
            continue
        result = torch.load(path, weights_only=False)  # written by our own worker just now
        if "error" in result:
            # the rank whose own code raised first; a rank that only lost its peer, or failed
            # while joining or leaving, comes after it
            key = (result.get("lost_peer", False), result["phase"] != "running", rank)
            errors.append((key, rank, result))
        else:
            results.append(result["ok"])
    if crashed:  # a crash is the cause: the others lost it or timed out waiting for it
        raise RuntimeError("\n".join(crashed))
    if errors:
        _, rank, r = min(errors)
        raise RuntimeError(
            f"rank {rank} of {world_size} raised {r['what']}\n  at {r['where']} "
            f"(while {r['phase']})\n\n{r['error']}"
        )
    if running:
        raise TimeoutError(
            f"ranks {running} of {world_size} were still running after timeout={timeout:g} s and "
            "were stopped: a rank waiting for a collective that another never calls hangs; if "
            "the work is just slow, pass a larger timeout="
        )
    return results


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
