"""`torchrun` for one machine, kept private and leaving nothing behind.

    python -m d2l_gpu.torchrun --nproc-per-node 2 -m d2l_gpu.train --strategy fsdp

Takes torchrun's own arguments and adds what lesson 7 explains: the rendezvous in a file instead
of on a network port (`--rdzv-backend c10d --rdzv-conf store_type=file`), the workers' store on
127.0.0.1, gloo on the loopback interface. torchrun leaves its rendezvous file and a
`torchelastic_*` log folder in the temporary folder after every job; here both live in a folder
of this job's own, removed when the job ends, however it ends. Ctrl-C and SIGTERM are passed on
to torchrun, which stops its workers; the exit status is torchrun's.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile

from .distributed import local_torchrun

USAGE = (
    "usage: python -m d2l_gpu.torchrun --nproc-per-node N [TORCHRUN OPTIONS] "
    "(-m MODULE | SCRIPT.py) [ARGS]"
)


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with `argv` on this machine only; return its exit status."""
    args = sys.argv[1:] if argv is None else list(argv)
    counts = [a for a in args if a.startswith("--nproc-per-node") or a == "--nproc_per_node"]
    if not counts or len(args) < 3:
        print(f"d2l_gpu.torchrun: say how many workers and what they run. {USAGE}", file=sys.stderr)
        return 2
    count = _count(args)
    if count is not None:
        print(f"d2l_gpu.torchrun: {count}. {USAGE}", file=sys.stderr)
        return 2
    if any(a.startswith(("--rdzv-endpoint", "--rdzv_endpoint", "--nnodes")) for a in args):
        print("d2l_gpu.torchrun is for one machine: drop --rdzv-endpoint and --nnodes, or call "
              "torchrun itself for a job across machines (lesson 7)", file=sys.stderr)  # fmt: skip
        return 2
    folder = tempfile.mkdtemp(prefix="d2l-torchrun-")
    try:
        cmd, extra = local_torchrun(None, *args, folder=folder)  # the count is in args
        proc = subprocess.Popen(cmd, env={**os.environ, **extra})
        forward = lambda signum, frame: proc.send_signal(signum)  # noqa: E731 - a signal handler
        old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            return proc.wait()
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


WORDS = ("auto", "cpu", "gpu", "xpu")  # torchrun's own: one worker per core or device
MOST = 4096  # far more workers than one machine runs


def _count(args: list[str]) -> str | None:
    """What is wrong with the value of --nproc-per-node in `args`, or None if it is right."""
    for i, a in enumerate(args):
        name, eq, value = a.partition("=")
        if name not in ("--nproc-per-node", "--nproc_per_node"):
            continue
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
        if value in WORDS or (value.isdigit() and 1 <= int(value) <= MOST):
            return None
        return (
            f"--nproc-per-node must be a whole number from 1 to {MOST} or one of "
            f"{', '.join(WORDS)}, got {value!r}"
        )
    return None


if __name__ == "__main__":
    sys.exit(main())
