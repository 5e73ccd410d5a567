"""Atomic checkpoints: write a temporary file, flush it to disk, then rename it over the old one.

A reader sees either the old checkpoint or the new one, never a half-written file: `os.replace`
is atomic on POSIX and Windows when both names are in the same folder. A writer killed mid-write
leaves only a hidden temporary file (`.NAME.*.tmp`), which the next successful save removes.
"""

from __future__ import annotations

import contextlib
import glob
import os
import random
import tempfile
from pathlib import Path

import torch

from ._fs import sync_folder

__all__ = [
    "CheckpointError",
    "check_checkpoint",
    "get_rng_state",
    "load_checkpoint",
    "save_atomic",
    "set_rng_state",
]

FORMAT = 1  # bump when the layout of the checkpoint dictionary changes


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or that belongs to another job."""


def save_atomic(obj, path) -> Path:
    """Write `obj` with torch.save to `path` atomically: a crash leaves the old file intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    sync_folder(path.parent)
    for stale in glob.glob(os.path.join(glob.escape(str(path.parent)), f".{path.name}.*.tmp")):
        with contextlib.suppress(OSError):  # left by a writer that was killed mid-write
            os.unlink(stale)
    return path


def load_checkpoint(path, map_location="cpu") -> dict | None:
    """Return the checkpoint dictionary at `path`, or None when there is no file there."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same advice
        raise CheckpointError(
            f"checkpoint {str(path)!r} cannot be read ({type(e).__name__}: {e}); "
            "delete it to start from scratch"
        ) from e
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(
            f"{str(path)!r} is not a d2l_gpu.ddp checkpoint (format {FORMAT}); "
            "delete it or choose another --checkpoint path"
        )
    return ckpt


def check_checkpoint(ckpt: dict, path, *, model: str, world_size: int) -> None:
    """Raise CheckpointError unless `ckpt` was written by a job of this `model` and `world_size`."""
    fix = f"delete {str(path)!r} or choose another --checkpoint path to start from scratch"
    if ckpt["model"] != model:
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds a {ckpt['model']} model, but this job trains "
            f"{model}: resume with --model {ckpt['model']}, or {fix}"
        )
    if ckpt["world_size"] != world_size:
        raise CheckpointError(
            f"checkpoint {str(path)!r} was written by a job of world size {ckpt['world_size']}, "
            f"but this job has world size {world_size}: relaunch with {ckpt['world_size']} "
            f"processes in all, or {fix}"
        )


def get_rng_state(device: torch.device) -> dict:
    """This process's random number generator states (Python, torch CPU and the CUDA device)."""
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    """Restore states returned by get_rng_state."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
