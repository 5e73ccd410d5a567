"""gloo groups whose collectives let go of their tensors in the order they were called.

Shown in lesson 11, whose held bytes are read from the C heap. PyTorch's gloo backend runs each
collective on one of its worker threads (two by default), and that thread drops the collective's
tensors only after the caller has seen it finish; a barrier called meanwhile keeps them until the
barrier itself is freed. A heap reading can then count a buffer the program has already dropped
(seen on a busy 2-core CPU: one of lesson 11's 4 MiB layers, in about 1 reading in 10). With one
worker thread, collectives run one after the other, and once one has finished, every earlier one
has let go of its tensors. `run_workers` and a lone process's group use one thread, on the
PyTorch versions where that has been checked (`ONE_THREAD_SINCE`); elsewhere they keep the default,
and held bytes are counted instead of read from the heap.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

# One gloo worker thread is used from this PyTorch on: checked on 2.13 (every test, 45 runs of
# lesson 11's readings); on 2.4.1 a rank of run_workers crashed in the profiler with it (2 runs of
# 15 of tests/test_profiling.py, 0 of 15 without). Versions in between are untested.
ONE_THREAD_SINCE = (2, 13)


def one_thread_checked() -> bool:
    """Whether this PyTorch is one on which `one_worker_thread` has been checked."""
    version = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
    return version >= ONE_THREAD_SINCE  # not distributed.torch_version: that module imports this


@contextlib.contextmanager
def one_worker_thread() -> Iterator[None]:
    """gloo groups created inside this block run their collectives on one worker thread (on the
    PyTorch versions where that was checked, `one_thread_checked`; elsewhere it does nothing)."""
    if not dist.is_available() or not dist.is_gloo_available() or not one_thread_checked():
        yield
        return
    c10d = dist.distributed_c10d
    gloo = c10d.ProcessGroupGloo  # what init_process_group and new_group construct

    class OneThread(gloo):
        def __init__(self, store, rank, size, timeout=timedelta(minutes=30)):
            options = gloo._Options()
            options._timeout = timeout
            options._devices = [gloo.create_default_device()]
            options._threads = 1
            super().__init__(store, rank, size, options)

    c10d.ProcessGroupGloo = OneThread
    try:
        yield
    finally:
        c10d.ProcessGroupGloo = gloo


def worker_threads(group=None) -> int | None:
    """How many worker threads the gloo backend of `group` (default: the world) runs; None where
    there is no group or it has no gloo backend."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    group = group if group is not None else dist.group.WORLD
    try:
        backend = group._get_backend(torch.device("cpu"))
        return int(backend.options._threads)
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return None
