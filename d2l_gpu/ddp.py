"""`python -m d2l_gpu.ddp`: the name lesson 7 first gave the training script, kept working.

The script is `d2l_gpu.train` (`python -m d2l_gpu.train`); this module runs the same `main`. It
stays because lesson 7, the README, the GPU report and the tests start the script by this name;
it counts as part of the train layer (see the package docstring): no module of d2l_gpu
imports it.
"""

from __future__ import annotations

from .distributed import end_process
from .train import TrainConfig, TrainError, main, parse_args, shard_indices, train
from .train.strategies.base import build_model

__all__ = ["DDPError", "TrainConfig", "build_model", "main", "parse_args", "shard_indices", "train"]

DDPError = TrainError  # the name of TrainError before the script became d2l_gpu.train

if __name__ == "__main__":
    end_process(main(prog="python -m d2l_gpu.ddp"))
