"""The book's FashionMNIST data module (d2l 1.0) on this package's data layer (no torchvision).

The files come from where `d2l.load_data_fashion_mnist` finds them (the `root` argument,
D2L_GPU_DATA, the system copy, the cache, a download; see d2l_gpu.data.fashion_mnist), with the
same quick profile cap on a CPU. Batches are made by slicing whole uint8 tensors, not image by
image.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._typed import wrap_public
from ..data.fashion_mnist import DataIter, get_fashion_mnist_labels, load_data_fashion_mnist
from ..plotting import show_images
from .classes import DataModule


class FashionSplit(torch.utils.data.Dataset):
    """One split of Fashion-MNIST as a Dataset: item i is (image (1, H, W) in [0, 1], label)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, resize=None):
        self.images, self.labels, self.resize = images, labels, resize

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        X = self.images[i].to(torch.float32).div(255).unsqueeze(0)
        if self.resize is not None:
            shrink = self.resize[0] < X.shape[-2] or self.resize[1] < X.shape[-1]
            X = F.interpolate(X[None], size=self.resize, mode="bilinear", antialias=shrink)
            X = X[0].clamp_(0, 1)
        return X, int(self.labels[i])


class FashionMNIST(DataModule):
    """The Fashion-MNIST dataset: `train` and `val` splits, batches of `batch_size`.

    The book's signature; `root` and `limit` (keep only the first `limit` examples of each
    split) are this package's additions, as in load_data_fashion_mnist.
    """

    def __init__(self, batch_size: int = 64, resize=(28, 28), *, root=None, limit=None):
        super().__init__()
        self.save_hyperparameters()
        train_iter, val_iter = load_data_fashion_mnist(batch_size, resize, root=root, limit=limit)
        self._size = train_iter.resize  # (h, w), checked by load_data_fashion_mnist
        if self._size == (28, 28):
            self._size = None  # nothing to resize
        self.train = FashionSplit(train_iter.X, train_iter.y, self._size)
        self.val = FashionSplit(val_iter.X, val_iter.y, self._size)

    def text_labels(self, indices) -> list[str]:
        """Return text labels."""
        return get_fashion_mnist_labels(indices)

    def get_dataloader(self, train: bool) -> DataIter:
        """Batches of the training (shuffled each pass) or the validation split."""
        split = self.train if train else self.val
        seed = int(torch.randint(2**62, ()).item())  # torch.manual_seed makes runs repeatable
        return DataIter(
            split.images, split.labels, self.batch_size, shuffle=train, resize=self._size, seed=seed
        )

    def visualize(self, batch, nrows: int = 1, ncols: int = 8, labels=()) -> None:
        """Show the first nrows * ncols images of `batch` with their (text) labels."""
        X, y = batch
        if not labels:
            labels = self.text_labels(y)
        show_images(X.squeeze(1), nrows, ncols, titles=labels)


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
