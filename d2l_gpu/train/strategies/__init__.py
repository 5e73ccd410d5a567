"""The training script's strategies, one module each, and the name -> class registry (lesson 7).

* ``ddp``: every rank holds the whole model; DistributedDataParallel averages the gradients.
* ``fsdp``: parameters, gradients and optimizer state sharded over the ranks (FSDP2).
* ``pipeline``: the model cut into one stage of consecutive layers per rank, micro-batches
  flowing through (``torch.distributed.pipelining``, the GPipe schedule).
* ``fsdp-tp``: --model transformer on a 2-D mesh, attention heads and MLP split over --tp ranks
  (tensor parallelism), sharded over the rest (FSDP2).
"""

from __future__ import annotations

from ..config import STRATEGIES, Placement, TrainConfig
from .base import Strategy
from .ddp import DDPStrategy
from .fsdp import FSDPStrategy
from .fsdp_tp import FSDPTPStrategy
from .pipeline import PipelineStrategy

__all__ = ["STRATEGY_CLASSES", "Strategy", "make_strategy", "strategy_class"]

STRATEGY_CLASSES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (DDPStrategy, FSDPStrategy, PipelineStrategy, FSDPTPStrategy)
}
if tuple(STRATEGY_CLASSES) != STRATEGIES:
    raise ImportError(
        f"the strategy classes {tuple(STRATEGY_CLASSES)} and the --strategy choices {STRATEGIES} "
        "differ: add the class to STRATEGY_CLASSES and its name to config.STRATEGIES"
    )


def strategy_class(name: str) -> type[Strategy]:
    """The class of strategy `name` ('ddp', 'fsdp', 'pipeline' or 'fsdp-tp')."""
    return STRATEGY_CLASSES[name]


def make_strategy(net, cfg: TrainConfig, where: Placement) -> Strategy:
    """Strategy `cfg.strategy` around `net` for job `cfg` on this rank."""
    return strategy_class(cfg.strategy)(net, cfg, where)
