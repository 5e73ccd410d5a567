"""What the workers train, and the one-device runs they are compared with: `Workload` (an MLP
on a toy batch, lessons 10 and 11) with `train_one_device`; `TransformerWorkload` (the small
transformer on random tokens, or on Python's help text) with `train_transformer`."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .. import _checks
from .._typed import wrap_public
from ..data.text import CHARS, encode, python_help_text, text_batch
from ..data.toy import toy_data
from ..gpt import transformer


@dataclass(frozen=True, kw_only=True)
class Workload:
    """The job a worker trains: an MLP of `widths` on one toy batch. Shown in lesson 10.

    `widths=None` leaves the model to the worker (LeNet in `tensor_parallel_worker`). Every
    worker that `run_workers` starts gets the same Workload, so every rank trains the same job.
    """

    widths: tuple[int, ...] | None
    steps: int = 4
    batch_size: int = 64
    lr: float = 0.1
    dtype: torch.dtype = torch.float64
    seed: int = 0

    def __post_init__(self):
        if self.widths is not None:
            widths = tuple(_checks.items("Workload: widths", self.widths, least=2))
            for w in widths:
                _checks.whole("Workload: each of widths", w)
            object.__setattr__(self, "widths", widths)
        _checks.whole("Workload: batch_size", self.batch_size)
        _checks.job("Workload", self)

    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole batch (X, y): random features of widths[0], labels below widths[-1]."""
        if self.widths is None:
            raise ValueError("Workload.data: this workload has widths=None; give it widths")
        return toy_data(self.batch_size, self.widths[0], self.widths[-1], self.seed, self.dtype)


def make_optimizer(params, name: str, lr: float) -> torch.optim.Optimizer:
    """The lessons' optimizers: 'sgd' (plain) or 'adam' (two state tensors per parameter)."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    raise ValueError(f"optimizer {name!r} is not known; use 'sgd' or 'adam'")


def train_one_device(
    net: nn.Module, X: torch.Tensor, y: torch.Tensor, steps: int, lr: float, optimizer="sgd"
) -> list[float]:
    """The reference: `steps` full-batch steps of `net` (in place) on one device; the losses."""
    _checks.module("train_one_device: net", net)
    _checks.whole("train_one_device: steps", steps)
    if len(X) != len(y):
        raise ValueError(f"train_one_device: X has {len(X)} examples but y has {len(y)}")
    opt, losses = make_optimizer(net.parameters(), optimizer, lr), []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(net(X), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@dataclass(frozen=True, kw_only=True)
class TransformerWorkload:
    """The job: d2l.transformer of these sizes on one batch, plain SGD. Shown in lesson 13.

    The batch is random tokens, or with `text=True` windows of Python's help text (one token
    per character, so `vocab` must hold its 96 characters).
    """

    vocab: int = 32
    d_model: int = 16
    num_heads: int = 4
    num_layers: int = 2
    seq_len: int = 8
    batch_size: int = 2
    steps: int = 2
    lr: float = 0.1
    dtype: torch.dtype = torch.float64
    seed: int = 0
    text: bool = False

    def __post_init__(self):
        for name in ("vocab", "d_model", "num_heads", "num_layers", "seq_len", "batch_size"):
            _checks.whole(f"TransformerWorkload: {name}", getattr(self, name))
        if self.d_model % self.num_heads:
            raise ValueError(
                f"TransformerWorkload: d_model={self.d_model} is not a multiple of num_heads="
                f"{self.num_heads}; choose sizes whose heads divide the width"
            )
        if not isinstance(self.text, bool):
            raise TypeError(f"TransformerWorkload: text must be True or False, got {self.text!r}")
        if self.text and self.vocab < len(CHARS):
            raise ValueError(
                f"TransformerWorkload: vocab={self.vocab} is smaller than the text's {len(CHARS)} "
                f"characters; pass vocab={len(CHARS)} (or more) with text=True"
            )
        _checks.job("TransformerWorkload", self)

    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Seeded tokens X [batch, seq_len] and their next tokens y (the targets)."""
        g = torch.Generator().manual_seed(self.seed)
        if self.text:
            return text_batch(_help_tokens(), self.batch_size, self.seq_len, g)
        tokens = torch.randint(self.vocab, (self.batch_size, self.seq_len + 1), generator=g)
        return tokens[:, :-1], tokens[:, 1:]

    def model(self) -> nn.Sequential:
        """The one-device reference model, in `dtype`."""
        net = transformer(self.vocab, self.d_model, self.num_heads, self.num_layers, self.seed)
        return net.to(self.dtype)


@functools.cache
def _help_tokens() -> torch.Tensor:
    """Python's help text as token ids, encoded once per process (data() is called often)."""
    return encode(python_help_text())


def transformer_loss(net: nn.Module, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the next-token predictions net(X) against y."""
    logits = net(X)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def train_transformer(
    net: nn.Module, X: torch.Tensor, y: torch.Tensor, steps: int, lr: float, sync=None
) -> list[float]:
    """`steps` plain SGD steps on (X, y), in place, `sync(net)` after each backward; the losses."""
    _checks.module("train_transformer: net", net)
    _checks.whole("train_transformer: steps", steps)
    losses = []
    for _ in range(steps):
        net.zero_grad()
        loss = transformer_loss(net, X, y)
        loss.backward()
        if sync is not None:
            sync(net)
        with torch.no_grad():
            for p in net.parameters():
                p -= lr * p.grad
        losses.append(loss.item())
    return losses


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
