"""run_workers: k real processes in one gloo group, results back in rank order; failures said as
what they are (the rank whose code raised, a crash, a timeout); nothing outlives a dead parent."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from d2l_gpu import distributed, workers

ROOT = Path(__file__).resolve().parent.parent


def summed(rank, world_size, base):
    """Every rank contributes rank + base; all_reduce must give every rank the same sum."""
    x = torch.tensor([float(rank + base)])
    dist.all_reduce(x)
    return rank, world_size, x.item(), os.getpid()


def fails(rank, world_size):
    if rank == 1:
        raise ValueError("rank 1 is broken on purpose")
    return rank


def fails_while_peer_waits(rank, world_size):
    """Rank 1's own bug; rank 0 meanwhile waits in a collective and loses its peer."""
    if rank == 1:
        raise ValueError("bug in rank 1")
    t = torch.ones(3)
    dist.all_reduce(t)
    return rank


def crashes(rank, world_size, how):
    if rank == 1:
        print("rank 1 about to crash", file=sys.stderr, flush=True)
        if how == "exit":
            os._exit(3)
        os.kill(os.getpid(), signal.SIGSEGV)
    dist.barrier()
    return rank


def mismatched(rank, world_size):
    from d2l_gpu.parallel.collectives import ring_all_reduce

    ring_all_reduce(torch.ones(10 + rank))  # lesson 12's ring, one more number on rank 1


def unpicklable(rank, world_size):
    return lambda: rank


def hangs(rank, world_size, folder):
    Path(folder, f"pid{rank}").write_text(str(os.getpid()))
    time.sleep(10**4)


def test_results_in_rank_order_from_separate_processes():
    out = workers.run_workers(summed, 3, 10, timeout=120)
    assert [r[:3] for r in out] == [(r, 3, 33.0) for r in range(3)]  # 10 + 11 + 12
    assert len({r[3] for r in out} | {os.getpid()}) == 4  # three new processes


def test_error_in_one_rank_is_raised_with_its_traceback():
    with pytest.raises(RuntimeError, match="rank 1 of 2 raised ValueError(.|\n)*broken on purpose"):
        workers.run_workers(fails, 2, timeout=120)


def test_the_rank_whose_code_failed_is_blamed_not_the_one_that_lost_it():
    """Issue 27: rank 0, waiting in all_reduce, lost its peer; the report named rank 0."""
    with pytest.raises(RuntimeError) as info:
        workers.run_workers(fails_while_peer_waits, 2, timeout=120)
    said = str(info.value)
    assert said.startswith("rank 1 of 2 raised ValueError: bug in rank 1"), said
    assert "test_distributed.py" in said.splitlines()[1]  # the student's line, not torch's


@pytest.mark.parametrize(("how", "said"), [("exit", "exited with code 3"), ("segv", "SIGSEGV")])
def test_a_crash_is_reported_as_a_crash_with_its_stderr(how, said):
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=f"rank 1 of 2 crashed: it .*{said}") as info:
        workers.run_workers(crashes, 2, how, timeout=120)
    assert "rank 1 about to crash" in str(info.value)
    assert "timeout" not in str(info.value)
    assert time.monotonic() - start < 100  # not the whole timeout: rank 0 lost its peer and ended


def test_sizes_that_differ_across_ranks_are_named_as_the_cause():
    with pytest.raises(RuntimeError, match="crashed") as info:
        workers.run_workers(mismatched, 2, backend="gloo", timeout=120)
    assert "tensors of different sizes (or dtypes)" in str(info.value)


def test_an_unpicklable_result_is_said_so():
    with pytest.raises(RuntimeError, match="return value cannot be sent back"):
        workers.run_workers(unpicklable, 2, timeout=120)


@pytest.mark.parametrize(("version", "kept"), [((2, 7), 1), ((2, 8), 0)])
def test_groups_are_kept_where_freeing_them_can_deadlock(monkeypatch, version, kept):
    """Before PyTorch 2.8 Python frees a group holding the GIL while the group joins its gloo
    threads, which may need the GIL (a deadlock seen on 2.4.1): leave_group keeps the groups
    there, and end_process then leaves without freeing them. From 2.8 they are freed."""
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setattr(distributed, "torch_version", lambda: version)
    monkeypatch.setattr(distributed, "_NEVER_FREED", [])
    distributed.join_group("gloo", torch.device("cpu"))
    distributed.leave_group()
    assert not dist.is_initialized() and len(distributed._NEVER_FREED) == kept


def test_a_hang_is_reported_as_a_timeout(tmp_path):
    with pytest.raises(
        TimeoutError, match=r"ranks \[0, 1\] of 2 were still running after timeout=3"
    ):
        workers.run_workers(hangs, 2, str(tmp_path), timeout=3)


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"world_size": 0}, "world_size must be a whole number"),
        ({"world_size": True}, "world_size must be a whole number"),
        ({"timeout": 0}, "timeout must be a positive"),
        ({"timeout": -1}, "timeout must be a positive"),
        ({"backend": "glo"}, "backend must be one of"),
        ({"threads": 0}, "threads must be"),
    ],
)
def test_bad_arguments_are_refused_at_the_call(kwargs, said):
    args = {"world_size": 2} | kwargs
    with pytest.raises(ValueError, match=said):
        workers.run_workers(summed, args.pop("world_size"), 0, **args)


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="this machine has a CUDA GPU")
def test_nccl_without_a_gpu_is_refused_at_the_call():
    with pytest.raises(ValueError, match="nccl' needs CUDA GPUs"):
        workers.run_workers(summed, 2, 0, backend="nccl")


def test_function_from_main_is_refused_with_advice():
    def local(rank, world_size):
        return rank

    local.__module__ = "__main__"
    with pytest.raises(ValueError, match="cannot import it"):
        workers.run_workers(local, 2)


def alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture
def short_tmp():
    """A folder with a short path: the fork server's socket path must fit in 108 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="d2l-t-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("start", ["forkserver", "spawn"])
def test_workers_end_when_their_parent_dies(tmp_path, short_tmp, start):
    """Issue 27: a kernel restart (the parent killed) left workers and a folder behind. With
    the fork server the workers are its children; under a TMPDIR too long for its socket,
    run_workers falls back to spawn and the workers are the caller's children."""
    folder = short_tmp if start == "forkserver" else tmp_path / ("long" * 20)
    folder.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]))
    env["TMPDIR"] = str(folder)  # the job's folder goes here, where we can look for it
    code = "import test_distributed as t, d2l_gpu as d2l; "
    code += f"d2l.run_workers(t.hangs, 2, {str(folder)!r})"
    parent = subprocess.Popen([sys.executable, "-c", code], env=env)
    deadline = time.monotonic() + 120
    while len(list(folder.glob("pid*"))) < 2:  # both workers are running
        assert parent.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    pids = [int(p.read_text()) for p in folder.glob("pid*")]
    assert list(folder.glob("d2l-workers-*"))
    starter = {Path(f"/proc/{parent_of(pid)}/cmdline").read_bytes() for pid in pids}
    assert len(starter) == 1 and (b"forkserver" in starter.pop()) == (start == "forkserver")
    parent.send_signal(signal.SIGKILL)  # SIGTERM ends it the same way
    parent.wait()
    deadline = time.monotonic() + 20
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids), "workers outlived their parent"
    assert not list(folder.glob("d2l-workers-*")), "the job's folder was left behind"


def test_backend_is_gloo_without_enough_cuda_devices():
    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has 2+ CUDA devices")
    assert distributed.pick_backend(2) == "gloo"


@pytest.mark.skipif(sys.platform != "linux", reason="the fork server is used on Linux only")
def test_the_fork_server_is_used_outside_a_kernel_even_with_ipykernel_imported():
    import ipykernel.kernelapp  # noqa: F401 - imported, as test_plotting's kernel tests do

    assert workers._context().get_start_method() == "forkserver"


def parent_pid(rank, world_size):
    return os.getppid()


def test_a_kernel_that_ran_workers_shuts_down_at_once():
    """A Jupyter kernel terminates its children at shutdown and waits until none is left:
    multiprocessing's resource tracker ignores SIGTERM, and a fork server it ended stayed a
    zombie, so Jupyter killed the kernel after 5 s (and every restart of a lesson 10-12 kernel
    took that long) until run_workers stopped the one and reaped the other. On Linux the
    workers come from the fork server in a kernel too (not from the kernel itself)."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        code = f"import os, sys; sys.path[:0] = [{str(ROOT / 'tests')!r}, {str(ROOT)!r}]\n"
        code += "import test_distributed as t, d2l_gpu as d2l\nd2l.run_workers(t.summed, 2, 0)\n"
        code += "parents = set(d2l.run_workers(t.parent_pid, 2))\n"
        code += "assert (os.getpid() not in parents) == (sys.platform == 'linux'), parents"
        reply = kc.execute_interactive(code, timeout=120)
        assert reply["content"]["status"] == "ok", reply["content"]
        kc.shutdown()  # the shutdown request alone, as Jupyter sends it first
        deadline = time.monotonic() + 3
        while km.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not km.is_alive(), "the kernel did not end within 3 s of its shutdown request"
    finally:
        km.shutdown_kernel(now=True)
        kc.stop_channels()
