"""The book's Trainer (d2l 1.0), device-agnostic: `num_gpus=1` uses any accelerator.

`Trainer(max_epochs, num_gpus=1)` trains on the first device of whatever accelerator PyTorch
finds (CUDA, ROCm, MPS, XPU, DirectML; d2l_gpu.devices), or on the CPU, saying so. It keeps the
book's attributes (`gpus`, `max_epochs`, `model`, `epoch`, `train_batch_idx`, ...) so that book
code extending it with `@d2l.add_to_class(d2l.Trainer)` (the "GPUs" chapter does) still works.
"""

from __future__ import annotations

import torch

from .. import _checks
from .._typed import wrap_public
from ..devices import gpu
from ..devices import num_gpus as _num_gpus
from .hparams import HyperParameters


class Trainer(HyperParameters):
    """Train a d2l Module on a d2l DataModule for `max_epochs` epochs."""

    def __init__(self, max_epochs: int, num_gpus: int = 0, gradient_clip_val: float = 0):
        # the checks assign no local variable: save_hyperparameters keeps every one
        _checks.whole("Trainer: max_epochs", max_epochs, least=0)
        _checks.whole("Trainer: num_gpus", num_gpus, least=0)
        _checks.number("Trainer: gradient_clip_val", gradient_clip_val)
        self.save_hyperparameters()
        self.gpus = [gpu(i) for i in range(min(num_gpus, _num_gpus()))]

    def prepare_data(self, data) -> None:
        """Take the data module's loaders and count their batches."""
        self.train_dataloader = data.train_dataloader()
        self.val_dataloader = data.val_dataloader()
        self.num_train_batches = len(self.train_dataloader)
        self.num_val_batches = len(self.val_dataloader) if self.val_dataloader is not None else 0

    def prepare_model(self, model) -> None:
        """Link model and trainer, set the board's x range, move the model to gpus[0]."""
        model.trainer = self
        model.board.xlim = [0, self.max_epochs]
        if self.gpus:
            model.to(self.gpus[0])
        self.model = model

    def prepare_batch(self, batch):
        """Move every tensor of `batch` to gpus[0] (when there is one)."""
        if self.gpus:
            batch = [a.to(self.gpus[0]) for a in batch]
        return batch

    def fit(self, model, data) -> None:
        """Train `model` on `data`: max_epochs epochs, each followed by validation."""
        self.prepare_data(data)
        self.prepare_model(model)
        asked = getattr(self, "num_gpus", 0)
        if asked and not getattr(self, "gpus", None):
            print(f"Trainer: num_gpus={asked}, but no accelerator was found: training on the CPU")
        self.optim = model.configure_optimizers()
        self.epoch = 0
        self.train_batch_idx = 0
        self.val_batch_idx = 0
        for epoch in range(self.max_epochs):
            self.epoch = epoch
            self.fit_epoch()

    def fit_epoch(self) -> None:
        """One pass over the training batches, then one over the validation batches."""
        self.model.train()
        for batch in self.train_dataloader:
            loss = self.model.training_step(self.prepare_batch(batch))
            self.optim.zero_grad()
            loss.backward()
            with torch.no_grad():
                if self.gradient_clip_val > 0:
                    self.clip_gradients(self.gradient_clip_val, self.model)
                self.optim.step()
            self.train_batch_idx += 1
        if self.val_dataloader is None:
            return
        self.model.eval()
        for batch in self.val_dataloader:
            with torch.no_grad():
                self.model.validation_step(self.prepare_batch(batch))
            self.val_batch_idx += 1

    def clip_gradients(self, grad_clip_val: float, model) -> None:
        """Scale all gradients down so that their joint L2 norm is at most `grad_clip_val`."""
        params = [p for p in model.parameters() if p.requires_grad and p.grad is not None]
        norm = torch.sqrt(sum(torch.sum(p.grad**2) for p in params))
        if norm > grad_clip_val:
            for param in params:
                param.grad[:] *= grad_clip_val / norm


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
