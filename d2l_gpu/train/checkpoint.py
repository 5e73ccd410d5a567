"""Atomic checkpoints, and the checks that make resuming safe (lesson 7).

A checkpoint is written to a temporary file, flushed to disk, then renamed over the old one: a
reader sees either the old checkpoint or the new one, never a half-written file (`os.replace` is
atomic on POSIX and Windows when both names are in the same folder). A writer killed mid-write
leaves only a hidden temporary file (`.NAME.*.tmp`), which the next successful save removes.
Before a job trains, `check_output` proves each output can be written; before it resumes,
`check_checkpoint` compares the settings and `check_state_fits` the tensors with this job's.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from .._fs import replace_file
from ..stopping import shielded
from .checkpoint_checks import (  # noqa: F401 - the checks are part of this module's interface
    CheckpointError,
    check_archive,
    check_fields,
    check_optimizer_state,
    check_rng_states,
    check_state_fits,
)
from .config import Placement, TrainConfig

__all__ = [
    "CheckpointError",
    "check_checkpoint",
    "check_optimizer_state",
    "check_output",
    "check_rng_states",
    "check_state_fits",
    "get_rng_state",
    "load_checkpoint",
    "resume",
    "save_atomic",
    "save_checkpoint",
    "set_rng_state",
]

FORMAT = 2  # bump when the layout of the checkpoint dictionary changes (2: settings recorded)


def save_atomic(obj, path) -> Path:
    """Write `obj` with torch.save to `path` atomically: a crash leaves the old file intact, and
    a Ctrl-C or SIGTERM meanwhile stops the rank only once the file is written."""
    with shielded():
        return replace_file(path, lambda f: torch.save(obj, f))


def check_output(path, flag: str) -> None:
    """Raise CheckpointError unless a file can be written at `path` (given as `flag`)."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(
            f"{flag} {str(path)!r} is a folder; give the path of a file in it, "
            f"e.g. {flag} {str(path / ('ckpt.pt' if 'checkpoint' in flag else 'model.pt'))!r}"
        )
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise CheckpointError(
            f"{flag} {str(path)!r} cannot be written ({e.strerror or e}): choose a folder you "
            "can write to; nothing was trained"
        ) from e


def load_checkpoint(path, map_location="cpu") -> dict | None:
    """Return the checkpoint dictionary at `path`, or None when there is no file there."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(
            f"--checkpoint {str(path)!r} is a folder, not a checkpoint file; give the path of a "
            f"file in it, e.g. --checkpoint {str(path / 'ckpt.pt')!r}"
        )
    if not path.exists():
        return None
    elsewhere = "or choose another --checkpoint path to start afresh"
    check_archive(path, elsewhere)
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same advice
        raise CheckpointError(
            f"checkpoint {str(path)!r} cannot be read ({type(e).__name__}: {e}); it was not "
            f"written by this script or is damaged: move it away, {elsewhere}"
        ) from e
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("format"), int):
        raise CheckpointError(
            f"{str(path)!r} is not a checkpoint of this training script: move it away, {elsewhere}"
        )
    if ckpt["format"] != FORMAT:
        raise CheckpointError(
            f"checkpoint {str(path)!r} has format {ckpt['format']}, this version of d2l_gpu "
            f"reads format {FORMAT}: resume it with the version that wrote it, {elsewhere}"
        )
    return ckpt


def check_checkpoint(
    ckpt: dict, path, settings: dict, *, world_size: int, may_change=()
) -> list[str]:
    """Raise CheckpointError if `ckpt` is another job's; return notes on allowed changes.

    Every setting in `settings` must equal the checkpoint's, except those in `may_change`,
    which are listed in the notes. The world size may change too (an elastic job re-formed with
    more or fewer ranks): the global batches do not depend on it."""
    old = ckpt.get("settings", {})
    differ = [k for k in settings if k not in may_change and old.get(k) != settings[k]]
    if differ:
        listed = "; ".join(
            f"--{k.replace('_', '-')} {old.get(k)} (now {settings[k]})" for k in differ
        )
        raise CheckpointError(
            f"checkpoint {str(path)!r} belongs to a job with other settings: {listed}. Resume "
            "with the checkpoint's settings, or start afresh with another --checkpoint path"
        )
    notes = [
        f"--{k.replace('_', '-')} {settings[k]} (the checkpoint's job had {old.get(k)})"
        for k in may_change
        if k in settings and old.get(k) != settings[k]
    ]
    if ckpt.get("world_size") != world_size:
        notes.append(f"world size {world_size} (the checkpoint's job had {ckpt.get('world_size')})")
    return notes


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


def resume(cfg: TrainConfig, net, where: Placement) -> dict | None:
    """The checkpoint of job `cfg` for `net` on every rank (`where`: this one), or None.

    Rank 0 checks that the outputs can be written, reads the checkpoint,
    checks its settings, tensors and states, and broadcasts the outcome: every rank gets the
    checkpoint, or every rank raises the same CheckpointError (none waits forever)."""
    payload, world = [None], where.world
    if where.rank == 0:
        try:
            for path, flag in ((cfg.checkpoint, "--checkpoint"), (cfg.save, "--save")):
                if path:
                    check_output(path, flag)
            ckpt = load_checkpoint(cfg.checkpoint) if cfg.checkpoint else None
            if ckpt is not None:
                check_fields(ckpt, cfg.checkpoint)
                settings = cfg.settings()
                notes = check_checkpoint(
                    ckpt, cfg.checkpoint, settings, world_size=world, may_change=cfg.MAY_CHANGE
                )
                check_state_fits(ckpt.get("model_state"), net.state_dict(), cfg.checkpoint)
                names = [name for name, _ in net.named_parameters()]
                check_optimizer_state(ckpt.get("optimizer_state"), names, cfg.checkpoint)
                check_rng_states(ckpt.get("rng"), ckpt.get("world_size"), cfg.checkpoint)
                ckpt["notes"] = notes
            payload = [("ok", ckpt)]
        except CheckpointError as e:
            payload = [("error", str(e))]
    dist.broadcast_object_list(payload, src=0)  # every rank fails together, none hangs
    status, value = payload[0]
    if status == "error":
        raise CheckpointError(value)
    return value


def _nbytes(obj) -> int:
    """Bytes of the tensors in a nested dict / list / tuple."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0


def write_failure(path, ckpt: dict, error: BaseException) -> str:
    """The sentence for a checkpoint that could not be written (a full disk, say)."""
    folder = Path(path).resolve().parent
    try:
        free = f"{shutil.disk_usage(folder).free / 2**20:.1f} MiB are free"
    except OSError:
        free = "the free space is unknown"
    why = getattr(error, "strerror", None) or str(error).strip().splitlines()[0][:200]
    kept = "the last good checkpoint is kept" if Path(path).exists() else "no checkpoint exists yet"
    return (
        f"cannot write the checkpoint {str(path)!r} ({why}): {free} in {str(folder)!r} and it "
        f"needs about {_nbytes(ckpt) / 2**20:.1f} MiB; {kept}. Free some space (or choose another "
        "--checkpoint), then run the same command to resume"
    )


def save_checkpoint(strategy, epoch: int) -> None:
    """Gather the full states and every rank's RNG state; rank 0 writes them atomically to the
    job's --checkpoint; all ranks wait until it is on disk, or all raise CheckpointError if it
    could not be written (the previous checkpoint is kept)."""
    cfg, rank, world = strategy.cfg, strategy.rank, strategy.world
    rng = [None] * world
    dist.all_gather_object(rng, get_rng_state(strategy.device))
    model_state, optimizer_state = strategy.model_state(), strategy.optimizer_state()
    outcome = [None]
    if rank == 0:
        ckpt = {"format": FORMAT, "settings": cfg.settings(), "world_size": world,
                "epoch": epoch, "model_state": model_state, "optimizer_state": optimizer_state,
                "rng": rng}  # fmt: skip
        try:
            save_atomic(ckpt, cfg.checkpoint)
            print(f"saved checkpoint (epoch {epoch}) to {cfg.checkpoint}", flush=True)
        except (OSError, RuntimeError) as e:  # torch.save says a full disk as a RuntimeError
            outcome = [write_failure(cfg.checkpoint, ckpt, e)]
    dist.broadcast_object_list(outcome, src=0)  # a rank that dies after this cannot lose this epoch
    if outcome[0] is not None:
        raise CheckpointError(outcome[0])
