"""The book's model and data base classes (d2l 1.0): Module, Classifier, DataModule, init_cnn.

Book code written for `from d2l import torch as d2l` subclasses these and trains them with
`d2l.Trainer` (d2l_gpu.book.trainer); see docs/maintaining.md for what differs from the book's.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .. import _checks
from .._typed import wrap_public
from .board import ProgressBoard
from .hparams import HyperParameters


class Module(nn.Module, HyperParameters):
    """The base class of models: forward through `self.net`, loss, optimizer, live plots."""

    def __init__(self, plot_train_per_epoch: int = 2, plot_valid_per_epoch: int = 1):
        _checks.whole("Module: plot_train_per_epoch", plot_train_per_epoch)
        _checks.whole("Module: plot_valid_per_epoch", plot_valid_per_epoch)
        super().__init__()
        self.save_hyperparameters()
        self.board = ProgressBoard()

    def loss(self, y_hat, y):
        """The training loss; subclasses define it."""
        raise NotImplementedError

    def forward(self, X):
        """Run `self.net`, which subclasses define."""
        if not hasattr(self, "net"):
            raise AttributeError(
                f"{type(self).__name__} has no attribute 'net': set self.net in __init__ "
                "or override forward"
            )
        return self.net(X)

    def plot(self, key: str, value, train: bool) -> None:
        """Plot a point in animation: `value` of `key`, on the train or the validation line."""
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            raise RuntimeError(
                f"{type(self).__name__}.plot needs self.trainer: it is set by Trainer.fit"
            )
        self.board.xlabel = "epoch"
        if train:
            x = trainer.train_batch_idx / trainer.num_train_batches
            n = trainer.num_train_batches / self.plot_train_per_epoch
        else:
            x = trainer.epoch + 1
            n = trainer.num_val_batches / self.plot_valid_per_epoch
        if isinstance(value, torch.Tensor):
            value = value.detach()  # converted when points are averaged: no sync every step
        self.board.draw(x, value, ("train_" if train else "val_") + key, every_n=int(n))

    def training_step(self, batch):
        """Loss of one batch (inputs..., labels); plotted on the training line."""
        l = self.loss(self(*batch[:-1]), batch[-1])
        self.plot("loss", l, train=True)
        return l

    def validation_step(self, batch) -> None:
        """Loss of one validation batch, plotted."""
        l = self.loss(self(*batch[:-1]), batch[-1])
        self.plot("loss", l, train=False)

    def configure_optimizers(self):
        """Minibatch SGD on every parameter with learning rate `self.lr`."""
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def apply_init(self, inputs, init=None) -> None:
        """Run `inputs` through the model once (so lazy layers get shapes), then apply `init`."""
        self.forward(*inputs)
        if init is not None:
            self.net.apply(init)


class Classifier(Module):
    """The base class of classification models: cross-entropy loss, accuracy, layer summary."""

    def validation_step(self, batch) -> None:
        """Validation loss and accuracy of one batch, both plotted."""
        Y_hat = self(*batch[:-1])
        self.plot("loss", self.loss(Y_hat, batch[-1]), train=False)
        self.plot("acc", self.accuracy(Y_hat, batch[-1]), train=False)

    def accuracy(self, Y_hat, Y, averaged: bool = True):
        """Fraction (or, with averaged=False, per-example 0/1) of correct predictions."""
        Y_hat = Y_hat.reshape((-1, Y_hat.shape[-1]))
        preds = Y_hat.argmax(dim=1).type(Y.dtype)
        compare = (preds == Y.reshape(-1)).type(torch.float32)
        return compare.mean() if averaged else compare

    def loss(self, Y_hat, Y, averaged: bool = True):
        """Cross-entropy between scores `Y_hat` and labels `Y`."""
        Y_hat = Y_hat.reshape((-1, Y_hat.shape[-1]))
        Y = Y.reshape((-1,))
        return F.cross_entropy(Y_hat, Y, reduction="mean" if averaged else "none")

    def layer_summary(self, X_shape) -> None:
        """Print each layer's output shape for a random input of `X_shape`."""
        param = next(self.parameters(), None)
        X = torch.randn(*X_shape, device=None if param is None else param.device)
        for layer in self.net:
            X = layer(X)
            print(layer.__class__.__name__, "output shape:\t", X.shape)


class DataModule(HyperParameters):
    """The base class of data: train_dataloader and val_dataloader from get_dataloader."""

    def __init__(self, root: str = "../data", num_workers: int = 4):
        self.save_hyperparameters()

    def get_dataloader(self, train: bool):
        """The training (train=True) or validation batches; subclasses define it."""
        raise NotImplementedError

    def train_dataloader(self):
        """The training batches."""
        return self.get_dataloader(train=True)

    def val_dataloader(self):
        """The validation batches."""
        return self.get_dataloader(train=False)

    def get_tensorloader(self, tensors, train: bool, indices=slice(0, None)):
        """A DataLoader over rows `indices` of `tensors`, shuffled when training."""
        dataset = torch.utils.data.TensorDataset(*(a[indices] for a in tensors))
        return torch.utils.data.DataLoader(dataset, self.batch_size, shuffle=train)


def init_cnn(module: nn.Module) -> None:
    """Xavier-uniform weights for every Linear and Conv2d (lazy layers are left for later).

    The book's (d2l 1.0): apply it after a first forward pass (Module.apply_init), when the
    lazy layers have their shapes.
    """
    if type(module) in (nn.Linear, nn.Conv2d):
        nn.init.xavier_uniform_(module.weight)


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
