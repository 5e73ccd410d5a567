"""How a rank of the training script ends: one sentence, and an exit status that says whether a
restart can help. Shown in lesson 7.

- 0: done.
- 1: lost contact with the other ranks (a rank died, the network failed): a restart can help;
  under `torchrun --max-restarts N` the job restarts and resumes from its `--checkpoint`.
- 2: cannot run as asked: flags, data, a checkpoint of another job or a damaged one, a checkpoint
  that cannot be written (a full disk). Final: a restart would fail the same way.
- 130: stopped by Ctrl-C or SIGTERM. Final. Rank 0 says which checkpoint is kept; under
  torchrun a SIGTERM comes from the agent, which reports why itself, and the ranks end quietly.
  A checkpoint being written when the signal comes is finished first (`shielded`), so that the
  epoch it holds is not lost; a second signal while the first is handled ends the rank at once.

torchrun restarts a job after any failing worker, whatever its status (it has no notion of a final
error), so for status 2 the rank sends its agent SIGTERM while restarts are left; the agent then
stops every worker and exits. A rank whose agent dies (SIGKILL) ends too, within a second.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator

from .distributed import end_with_parent

DONE, LOST, FINAL, STOPPED = 0, 1, 2, 130
# final: a final error was said (the agent's SIGTERM then ends quietly); stopping: the signal
# being handled (a second one ends the rank at once); shield: depth of `shielded` blocks
_state: dict = {"final": False, "stopping": None, "shield": 0}


class Stopped(Exception):  # noqa: N818 - not an error: the person or the agent asked for it
    """Raised in a rank by Ctrl-C (SIGINT) or SIGTERM, so that it ends with a sentence."""


def say_line(text: str, stream=None) -> None:
    """Write `text` and its newline to stderr in one write, so that ranks sharing a pipe never
    interleave their sentences (a pipe keeps a write of up to 4096 bytes whole)."""
    stream = sys.stderr if stream is None else stream
    data = (text + "\n").encode("utf-8", "replace")
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # a notebook's stream has no file descriptor
        stream.write(data.decode("utf-8"))
        stream.flush()
        return
    stream.flush()
    os.write(fd, data[:4095] + (b"\n" if len(data) > 4095 else b""))


def _raise_stopped(signum, frame) -> None:
    if _state["final"]:  # the agent stopping us after our own final error: nothing to add
        os._exit(FINAL)
    if signum == signal.SIGTERM and under_torchrun():
        # the agent stops every rank when one failed (or when it was told to stop): it says why
        os._exit(STOPPED)
    name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    if _state["stopping"] is not None:  # a second signal while the first is handled: now
        say_line(f"stopped again by {name}: ending at once")
        os._exit(STOPPED)
    _state["stopping"] = name
    if _state["shield"] == 0:
        raise Stopped(name)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Hold back a Ctrl-C or SIGTERM while the block runs (a checkpoint being written): it is
    raised as `Stopped` once the block has finished, so the block is never cut in two."""
    _state["shield"] += 1
    try:
        yield
    finally:
        _state["shield"] -= 1
    if _state["shield"] == 0 and _state["stopping"] is not None:
        raise Stopped(_state["stopping"])


def stop_on_signals() -> None:
    """Turn Ctrl-C and SIGTERM into `Stopped` in this (main) thread: a sentence, no traceback."""
    _state.update(final=False, stopping=None, shield=0)
    signal.signal(signal.SIGINT, _raise_stopped)
    signal.signal(signal.SIGTERM, _raise_stopped)


def under_torchrun() -> bool:
    """Was this process started by a torchrun agent?"""
    return "TORCHELASTIC_RUN_ID" in os.environ


def stop_restarts() -> bool:
    """After a final error under torchrun with restarts left, ask the agent to stop (SIGTERM)."""
    _state["final"] = True
    if not under_torchrun():
        return False
    left = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    left -= int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if left <= 0:
        return False
    try:
        os.kill(os.getppid(), signal.SIGTERM)
    except OSError:
        return False
    return True


def kept(checkpoint: str | None) -> str:
    """What a stopped job leaves to resume from, in words."""
    if checkpoint and os.path.exists(checkpoint):
        return f"the checkpoint {checkpoint} is kept: run the same command to resume from it"
    return "no checkpoint was written (pass --checkpoint PATH to keep the progress of each epoch)"


def end_with_agent(name: str, rank: str) -> None:
    """Under torchrun: end this rank, with a sentence, if its agent dies (a SIGKILLed agent)."""
    if under_torchrun():
        end_with_parent(
            lambda: say_line(
                f"{name}: rank {rank} stops: the torchrun agent that started it is gone"
            )
        )
