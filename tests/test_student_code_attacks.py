"""A student's function run on real ranks, misbehaving every way it can (issue 46, item 3).

The lessons' runners (`own_stage_worker`, lesson 10; `own_all_reduce_worker`, lesson 12) take a
student's function as source text and call it on every rank. Whatever that function does (raise,
exit, end the interpreter, recurse without end, wait forever), `run_workers` must come back
within its timeout with one sentence that names the rank and what happened, and leave no process
behind (the session's leftover check, tests/leftovers.py, fails on any); a rank that prints
megabytes is cut after 2**20 characters with a sentence naming it.
"""

from __future__ import annotations

import io
import multiprocessing
import subprocess
import sys
import time

import pytest

from d2l_gpu._capped import LIMIT, Capped
from d2l_gpu.parallel import workload
from d2l_gpu.parallel.own_collective import own_all_reduce_worker
from d2l_gpu.parallel.own_stage import own_stage_worker
from d2l_gpu.workers import run_workers

WORK = workload.Workload(widths=(8, 16, 4), steps=2, batch_size=6)
TIMEOUT = 20  # seconds a run may take; the one that hangs on purpose gets HANG_TIMEOUT
HANG_TIMEOUT = 4

# what the student's function does -> (its body, what the sentence must say)
MISDEEDS = {
    "raises": ("    return 1 / 0\n", "rank 0 of 2 raised ZeroDivisionError"),
    "exits": ("    import os\n    if rank == 1:\n        os._exit(3)\n", "rank 1 of 2 crashed"),
    "ends the interpreter": ("    import sys\n    sys.exit(4)\n", "raised SystemExit: 4"),
    "is interrupted": ("    raise KeyboardInterrupt\n", "raised KeyboardInterrupt"),
    "recurses forever": (
        "    return f(stage, X, y, rank, world, width)\n",
        "ranks 0, 1 raised Rec",
    ),
    "waits forever": ("    import time\n    time.sleep(10**6)\n", "still running after timeout"),
}


def run_stage(source: str, timeout: float):
    """own_stage_worker on 2 ranks with `source`: its result, or the error's sentence."""
    try:
        return run_workers(own_stage_worker, 2, source, WORK, 2.0, timeout=timeout)
    except (RuntimeError, TimeoutError) as e:
        return str(e)


@pytest.mark.parametrize("misdeed", MISDEEDS)
def test_a_stage_that_misbehaves_is_said_in_a_sentence_in_time(misdeed):
    body, words = MISDEEDS[misdeed]
    timeout = HANG_TIMEOUT if misdeed == "waits forever" else TIMEOUT
    start = time.monotonic()
    said = run_stage("def f(stage, X, y, rank, world, width):\n" + body, timeout)
    took = time.monotonic() - start
    assert words in str(said), said
    assert took < timeout + 15, f"{took:.0f} s for a run given {timeout} s"
    assert not multiprocessing.active_children()  # every rank ended and was reaped


def all_reduce(rank, world, source):
    return own_all_reduce_worker(rank, world, source, nbytes=4096, rounds=1, wait_s=0.5)


def test_an_all_reduce_that_raises_on_one_rank_is_said_with_that_rank():
    source = "def f(x, ranks):\n    import torch.distributed as d\n"
    source += "    if d.get_rank() == 2:\n        raise ValueError('my mistake')\n"
    with pytest.raises(RuntimeError, match=r"rank 2 of 3 raised ValueError: my mistake"):
        run_workers(all_reduce, 3, source, timeout=TIMEOUT)
    assert not multiprocessing.active_children()


SCRIPT = """
from d2l_gpu.parallel import workload
from d2l_gpu.parallel.own_stage import own_stage_worker
from d2l_gpu.workers import run_workers

SOURCE = "def f(stage, X, y, rank, world, width):\\n    print('x' * 5_000_000)\\n    return ...\\n"
if __name__ == "__main__":
    work = workload.Workload(widths=(8, 16, 4), steps=2, batch_size=6)
    print("result:", run_workers(own_stage_worker, 2, SOURCE, work, 2.0, timeout=60))
"""


def test_a_stage_that_prints_megabytes_is_cut_with_a_sentence_per_rank(tmp_path):
    """Each rank prints 5 MB per step: the caller sees at most 2**20 characters of it per rank,
    the sentence that says so naming the rank, and the run's result."""
    script = tmp_path / "prints.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(done.stdout) < 2 * (LIMIT + 1000), len(done.stdout)  # not 2 x 2 x 5 MB
    for rank in (0, 1):
        assert done.stdout.count(f"[rank {rank} printed more than") == 1
    assert "result: [Ellipsis, Ellipsis]" in done.stdout


def test_capped_passes_the_first_characters_and_says_once_what_it_cut():
    out = io.StringIO()
    capped = Capped(out, rank=3, limit=10)
    assert capped.write("abcdef") == 6 and capped.write("ghijkl") == 6 and capped.write("m") == 1
    text = out.getvalue()
    assert text.startswith("abcdefghij\n[rank 3 printed more than 10 characters")
    assert text.count("[rank 3") == 1 and "k" not in text.split("\n")[0]
