"""How the training script's ranks take Ctrl-C and SIGTERM (d2l_gpu.stopping).

A signal becomes `Stopped` (a sentence, no traceback), but never in the middle of a checkpoint
being written: `save_atomic` holds it back until the file is whole, so the epoch is kept. The
negative control writes the same way without the shield and loses the new file. A second signal
while the first is handled ends the process at once, with a line and status 130.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from d2l_gpu import stopping
from d2l_gpu._fs import replace_file
from d2l_gpu.train.checkpoint import save_atomic

real_save = torch.save

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="signals sent with os.kill")


@pytest.fixture
def handlers():
    """Install the script's handlers for one test; the test runner's afterwards."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    stopping.stop_on_signals()
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
        stopping._state.update(stopping=None, shield=0)


def halfway_signal(signum: int):
    """A torch.save that receives `signum` once it has written half of its bytes."""

    def save(obj, f):
        buf = io.BytesIO()
        real_save(obj, buf)
        data = buf.getvalue()
        f.write(data[: len(data) // 2])
        os.kill(os.getpid(), signum)  # the handler runs here, between two bytecodes
        f.write(data[len(data) // 2 :])

    return save


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_a_checkpoint_write_stops_after_the_file_is_whole(
    signum, handlers, tmp_path, monkeypatch
):
    path = tmp_path / "ckpt.pt"
    save_atomic({"epoch": 1}, path)
    monkeypatch.setattr(torch, "save", halfway_signal(signum))
    with pytest.raises(stopping.Stopped, match="Ctrl-C" if signum == signal.SIGINT else "SIGTERM"):
        save_atomic({"epoch": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) == {"epoch": 2}  # the new epoch is kept
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temporary file left


def test_without_the_shield_the_same_signal_loses_the_new_file(handlers, tmp_path):
    """The negative control: the same write, unshielded, is cut in two and discarded."""
    path = tmp_path / "ckpt.pt"
    save_atomic({"epoch": 1}, path)
    save = halfway_signal(signal.SIGINT)
    with pytest.raises(stopping.Stopped):
        replace_file(path, lambda f: save({"epoch": 2}, f))
    assert torch.load(path, weights_only=True) == {"epoch": 1}


def test_shielded_blocks_nest_and_raise_once_at_the_outermost(handlers):
    ran = []
    with pytest.raises(stopping.Stopped):
        with stopping.shielded():
            with stopping.shielded():
                os.kill(os.getpid(), signal.SIGINT)
                ran.append("inner")
            ran.append("outer")  # still inside the outer block: the stop waits
    assert ran == ["inner", "outer"]


def test_no_signal_no_stop(handlers, tmp_path):
    with stopping.shielded():
        pass
    assert save_atomic({"epoch": 3}, tmp_path / "a.pt").is_file()


SECOND = """
import os, signal, time
from d2l_gpu import stopping
stopping.stop_on_signals()
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
except stopping.Stopped as e:
    print("first:", e, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)  # while the first is still being handled
    time.sleep(5)
    print("never printed")
"""


def test_a_second_signal_while_the_first_is_handled_ends_at_once(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(SECOND)], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == stopping.STOPPED, done
    assert done.stdout == "first: Ctrl-C\n", done
    assert done.stderr == "stopped again by SIGTERM: ending at once\n", done
