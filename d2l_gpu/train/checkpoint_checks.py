"""Checks that a checkpoint can be trusted before training resumes from it (lesson 7): the archive's
checksums, the recorded counts and settings, and tensors and states that fit this model."""

from __future__ import annotations

import math
import zipfile
from pathlib import Path

import torch


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or belongs to another job, or an output not writable."""


def check_archive(path: Path, advice: str) -> None:
    """Raise CheckpointError unless every part of the archive torch.save wrote has its checksum
    (torch.load alone reads a damaged file without noticing)."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise CheckpointError(
            f"checkpoint {str(path)!r} cannot be read: it is damaged or not a checkpoint ({e}): "
            f"move it away, {advice}"
        ) from e
    if bad is not None:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is damaged: its part {bad!r} fails its checksum (a bad "
            f"disk or an interrupted copy): move it away, {advice}"
        )


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_fields(ckpt: dict, path) -> None:
    """Raise CheckpointError unless the recorded counts and optimizer settings have sane types
    and ranges (epoch 0..epochs, world size >= 1, finite non-negative rates)."""
    problems = []
    epochs = (
        ckpt.get("settings", {}).get("epochs") if isinstance(ckpt.get("settings"), dict) else None
    )
    epoch, world = ckpt.get("epoch"), ckpt.get("world_size")
    if not _whole(epoch) or epoch < 0 or (_whole(epochs) and epoch > epochs):
        problems.append(f"epoch {epoch!r} (a whole number from 0 to {epochs})")
    if not _whole(world) or world < 1:
        problems.append(f"world_size {world!r} (a whole number >= 1)")
    groups = ckpt.get("optimizer_state", {}).get("param_groups", [])
    for group in groups if isinstance(groups, list) else []:
        for key in ("lr", "momentum", "dampening", "weight_decay"):
            value = group.get(key, 0.0) if isinstance(group, dict) else None
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not math.isfinite(value) or value < 0:
                problems.append(f"optimizer {key} {value!r} (a finite number >= 0)")
    if problems:
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds values no run of this script writes: "
            f"{'; '.join(problems[:4])}; it is damaged: start afresh with another --checkpoint path"
        )


def check_state_fits(state, reference: dict, path, what: str = "model") -> None:
    """Raise CheckpointError unless `state` has the keys, shapes and dtypes of `reference`."""
    where = f"checkpoint {str(path)!r}"
    if not isinstance(state, dict):
        raise CheckpointError(f"{where} holds no {what} state (found {type(state).__name__})")
    missing, extra = sorted(set(reference) - set(state)), sorted(set(state) - set(reference))
    problems = [f"missing {', '.join(missing[:5])}"] if missing else []
    problems += [f"unexpected {', '.join(extra[:5])}"] if extra else []
    for k in sorted(set(reference) & set(state)):
        ref, got = reference[k], state[k]
        if not isinstance(got, torch.Tensor):
            problems.append(f"{k} is a {type(got).__name__}, not a tensor")
        elif got.shape != ref.shape or got.dtype != ref.dtype:
            problems.append(
                f"{k} is {got.dtype} {tuple(got.shape)}, the model needs {ref.dtype} "
                f"{tuple(ref.shape)}"
            )
    if problems:
        raise CheckpointError(
            f"{where}: its {what} tensors do not fit this model ({'; '.join(problems[:5])}); "
            "it was written for another model, or is damaged: start afresh with another "
            "--checkpoint path"
        )


def check_optimizer_state(state, param_names, path) -> None:
    """Raise CheckpointError unless `state` is an optimizer state over exactly `param_names`."""
    try:
        named = [n for g in state["param_groups"] for n in g["params"]]
        ok = sorted(named) == sorted(param_names) and isinstance(state["state"], dict)
        ok = ok and all(isinstance(g["lr"], float) for g in state["param_groups"])
        ok = ok and set(state["state"]) <= set(param_names)
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise CheckpointError(
            f"checkpoint {str(path)!r}: its optimizer state does not fit this model's "
            "parameters; it is damaged: start afresh with another --checkpoint path"
        )


def check_rng_states(states, world_size: int, path) -> None:
    """Raise CheckpointError unless `states` holds one get_rng_state result per rank."""
    if not isinstance(states, list) or len(states) != world_size:
        raise CheckpointError(
            f"checkpoint {str(path)!r} holds no random-number state per rank; it is damaged: "
            "start afresh with another --checkpoint path"
        )
    size = torch.get_rng_state().shape
    for state in states:
        try:
            good = isinstance(state["torch"], torch.Tensor) and state["torch"].shape == size
            good = good and isinstance(state["python"], tuple)
        except (KeyError, TypeError):
            good = False
        if not good:
            raise CheckpointError(
                f"checkpoint {str(path)!r} holds no valid random-number state; it is damaged: "
                "start afresh with another --checkpoint path"
            )
