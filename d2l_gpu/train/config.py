"""The typed settings of a training job (lesson 7): `TrainConfig`, whose fields are also the
script's flags, and `Placement`, where one process of the job runs; the models --model names.

Each field is written once: its type, default and help text (`field(metadata=...)`) make both the
frozen dataclass and its `--flag`; `parse_args` builds the parser from the fields.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import NoReturn

import torch
from torch import nn

from .._checks import MOST, positive_arg, rate_arg
from ..data.text import CHARS
from ..gpt import transformer
from ..models import LeNet, resnet18

__all__ = ["MODELS", "STRATEGIES", "Placement", "TrainConfig", "TrainError", "parse_args"]

SEQ_LEN = 64  # characters per example of --model transformer (and 64 next characters to predict)


def char_transformer(seed: int = 0) -> nn.Sequential:
    """--model transformer: lesson 13's decoder over the 96 characters of `data.text`, two
    blocks of width 64 and four heads (about 110 thousand parameters)."""
    return transformer(vocab=len(CHARS), d_model=64, num_heads=4, num_layers=2, seed=seed)


MODELS = {"lenet": LeNet, "resnet18": resnet18, "transformer": char_transformer}  # build_model
TEXT_MODELS = ("transformer",)  # trained on Python's help text, not Fashion-MNIST
BATCHNORM_MODELS = ("resnet18",)  # what --sync-bn changes
DTYPES = {"float32": torch.float32, "float64": torch.float64}
STRATEGIES = ("ddp", "fsdp", "pipeline", "fsdp-tp")  # classes: strategies.STRATEGY_CLASSES


class TrainError(ValueError):
    """A job that cannot run as asked (sizes that do not fit, a loss that is no longer finite)."""


SEEDS = 2**32  # --seed takes 0 .. 2**32 - 1: every epoch's seed (seed * 100_003 + epoch) fits


def _seed(text: str) -> int:
    """argparse type for --seed: a whole number PyTorch's generators take, with room per epoch."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= value < SEEDS:
        raise argparse.ArgumentTypeError(
            f"must be a whole number from 0 to {SEEDS - 1}, not {text}"
        )
    return value


def flag(default, help=None, **options):  # noqa: A002 - argparse's own word
    """A TrainConfig field and its --flag: `help` gets the default appended, `options` go to
    argparse's add_argument (metavar, choices, type, action)."""
    return field(default=default, metadata={"help": help, **options})


@dataclass(frozen=True)
class TrainConfig:
    """The settings of one training job: what the flags fill and what a checkpoint records."""

    model: str = flag("lenet", choices=list(MODELS))
    epochs: int = flag(10, "epochs in all", metavar="E")
    batch_size: int = flag(256, "global batch", metavar="B")
    lr: float = flag(0.2, "SGD learning rate", type=rate_arg)
    limit: int | None = flag(None, "use the first N examples per split", metavar="N")
    seed: int = flag(0, "init and shuffling seed", metavar="S", type=_seed)
    checkpoint: str | None = flag(None, "resume from / save to after each epoch", metavar="PATH")
    save: str | None = flag(None, "write the final model state_dict here", metavar="PATH")
    data_dir: str | None = flag(
        None, "Fashion-MNIST folder (else D2L_GPU_DATA); not for --model transformer", metavar="DIR"
    )
    backend: str = flag("auto", "", choices=["auto", "nccl", "gloo"])
    strategy: str = flag(
        "ddp",
        "ddp: whole model per rank; fsdp: sharded; pipeline: layers cut; fsdp-tp: --model "
        "transformer on a 2-D mesh, heads split over --tp ranks, sharded over the rest",
        choices=list(STRATEGIES),
    )
    tp: int = flag(2, "ranks that split each block's heads for --strategy fsdp-tp", metavar="T")
    microbatches: int = flag(
        4, "micro-batches per global batch for --strategy pipeline", metavar="M"
    )
    accumulate: int = flag(
        1,
        "cut each rank's part of a global batch into A micro-batches whose gradients add up "
        "before one synchronisation (ddp, fsdp); BatchNorm then sees the smaller micro-batches",
        metavar="A",
    )
    sync_bn: bool = flag(
        False,
        "BatchNorm statistics over the whole global batch, not each rank's part (--strategy ddp; "
        "PyTorch's SyncBatchNorm on CUDA GPUs, the course's GlobalBatchNorm elsewhere)",
        action=argparse.BooleanOptionalAction,
    )
    dtype: str = flag("float32", "", choices=list(DTYPES))
    timeout: float = flag(
        600.0,
        "seconds a rank waits for the others before it gives up",
        metavar="S",
        type=positive_arg,
    )
    progress: bool | None = flag(
        None,
        "progress bar per epoch (default: only when stderr is a terminal)",
        action=argparse.BooleanOptionalAction,
    )

    # settings that define the job: a resumed job must have the checkpoint's
    MUST_MATCH = ("model", "batch_size", "lr", "limit", "seed", "data_dir", "dtype")
    # settings that may change on resume (said when they do): more epochs, another strategy
    MAY_CHANGE = ("epochs", "strategy", "microbatches", "accumulate", "sync_bn", "tp")

    def __post_init__(self):
        for name in ("epochs", "batch_size", "limit", "microbatches", "accumulate", "tp"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"--{_flag(name)} must be a positive integer, got {value}")
            if value is not None and value >= 2**63:  # what PyTorch's int64 holds
                raise ValueError(
                    f"--{_flag(name)} must be a positive integer below 2**63, got {value}"
                )
        for name in ("lr", "timeout"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"--{name} must be a positive finite number, got {value}")
            if name == "timeout" and value > MOST:  # past 1e9 s it overflowed timedelta
                raise ValueError(f"--{name} must be at most {MOST:g}, got {value}")
        seed = self.seed
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEEDS:
            raise ValueError(f"--seed must be a whole number from 0 to {SEEDS - 1}, got {seed!r}")
        for name, allowed in (("model", MODELS), ("dtype", DTYPES), ("strategy", STRATEGIES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"--{name} must be one of {', '.join(allowed)}")
        if self.sync_bn and self.model not in BATCHNORM_MODELS:
            raise ValueError(
                f"--sync-bn: --model {self.model} has no BatchNorm, so it would change nothing"
            )
        if self.data_dir is not None and not str(self.data_dir).strip():
            raise ValueError("--data-dir is empty: name the folder that holds Fashion-MNIST")
        if self.data_dir is not None and self.model in TEXT_MODELS:
            raise ValueError(
                f"--data-dir names the Fashion-MNIST folder, and --model {self.model} reads "
                "Python's own help text (shipped with Python): leave out --data-dir"
            )
        if self.strategy == "fsdp-tp" and self.model not in TEXT_MODELS:
            raise ValueError(
                f"--strategy fsdp-tp splits a transformer's attention heads and MLP; --model "
                f"{self.model} has none: use --model transformer, or --strategy ddp or fsdp"
            )
        if self.sync_bn and self.strategy != "ddp":
            raise ValueError(
                f"--sync-bn works with --strategy ddp, not {self.strategy}: SyncBatchNorm sums "
                "statistics over the ranks that each hold a part of the batch and the whole model"
            )
        if self.checkpoint and self.save and _same_file(self.checkpoint, self.save):
            raise ValueError(
                f"--checkpoint and --save name the same file {self.save!r}: the final model "
                "would replace the checkpoint; give --save another path"
            )

    def settings(self) -> dict:
        """What a checkpoint records and a resume compares (no output paths, no display)."""
        return {k: getattr(self, k) for k in self.MUST_MATCH + self.MAY_CHANGE}


@dataclass(frozen=True)
class Placement:
    """Where one process of a job runs: its rank, the world size and its device."""

    rank: int
    world: int
    device: torch.device


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _same_file(a: str, b: str) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def _shown(default) -> str:
    """A default as the help text shows it: 600.0 as 600, 0.2 as 0.2."""
    return f"{default:g}" if isinstance(default, float) else str(default)


def _argument(f) -> dict:
    """add_argument's keywords for TrainConfig field `f`."""
    options = {k: v for k, v in f.metadata.items() if k != "help"}
    text = f.metadata.get("help")
    if f.default is not None and f.default is not MISSING:
        options["default"] = f.default
        if text is not None:
            text = f"{text} ({_shown(f.default)})".lstrip()
    if text is not None:
        options["help"] = text
    if "type" not in options and "choices" not in options and "action" not in options:
        options["type"] = int if f.type.startswith("int") else str
    return options


class _Parser(argparse.ArgumentParser):
    """argparse that says a refusal once under torchrun: rank 0 prints it, every other rank
    exits 2 without a word (four ranks had printed the usage and the sentence four times)."""

    def error(self, message: str) -> NoReturn:
        if os.environ.get("RANK", "0") != "0":
            self.exit(2)
        super().error(message)


def parse_args(argv=None, prog: str = "python -m d2l_gpu.train") -> TrainConfig:
    """Parse the command line into a TrainConfig (exit 2 naming the flag on bad input)."""
    p = _Parser(
        prog=prog,
        description="Train on Fashion-MNIST, or a character transformer on Python's help text, "
        "on one process or many (under torchrun).",
    )
    for f in fields(TrainConfig):
        p.add_argument(f"--{_flag(f.name)}", **_argument(f))
    args = p.parse_args(argv)
    try:
        return TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    except ValueError as e:
        p.error(str(e))
