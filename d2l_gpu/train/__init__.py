"""The training script of lesson 7 (`python -m d2l_gpu.train`): Fashion-MNIST, or a character
transformer on Python's help text, on one process or many under torchrun.

config.py    TrainConfig (the settings, also the flags) and parse_args, Placement, TrainError
loop.py      main and train: join the group, build, resume, train, checkpoint, save
epochs.py    the global batches, each rank's shard, one epoch of training and evaluation
checkpoint.py (+ checkpoint_checks.py)  atomic checkpoints and the checks that make resuming safe
strategies/  one module per --strategy (ddp, fsdp, pipeline, fsdp-tp) on an abstract base, and
             the registry

The layer above all others: nothing in d2l_gpu imports it (see the package docstring).
"""

from .config import TrainConfig, TrainError, parse_args
from .epochs import shard_indices
from .loop import main, train

__all__ = ["TrainConfig", "TrainError", "main", "parse_args", "shard_indices", "train"]
