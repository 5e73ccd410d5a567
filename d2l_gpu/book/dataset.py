"""The book's own ways of doing things, kept to compare with (lesson 9's baseline pipeline)."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image  # Pillow: declared in pyproject.toml (matplotlib needs it too)

from .. import _checks
from .._typed import wrap_public
from ..data.fashion_mnist import read_fashion_mnist


class BookStyleDataset(torch.utils.data.Dataset):
    """Fashion-MNIST read the book's way: each image converted on its own as it is fetched."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, resize=None):
        if not isinstance(images, torch.Tensor) or len(images) != len(labels):
            raise ValueError("BookStyleDataset needs a tensor of images and as many labels")
        self.images, self.labels, self.resize = images.numpy(), labels.numpy(), resize

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):

        img = Image.fromarray(self.images[i], mode="L")  # like torchvision's FashionMNIST
        if self.resize is not None:
            img = img.resize((self.resize, self.resize), Image.BILINEAR)
        X = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255).unsqueeze(0)  # ToTensor
        return X, int(self.labels[i])


def load_data_book_style(batch_size, resize=None, *, root=None, limit=None, num_workers=4):
    """(train_iter, test_iter) as in the book: per-sample Dataset, DataLoader with workers."""
    _checks.whole("load_data_book_style: batch_size", batch_size)
    if resize is not None:
        _checks.whole("load_data_book_style: resize (the side of a square)", resize)
    if limit is not None:
        _checks.whole("load_data_book_style: limit", limit)
    _checks.whole("load_data_book_style: num_workers", num_workers, least=0)
    raw = read_fashion_mnist(root)
    n = slice(None, limit)
    sets = [
        BookStyleDataset(raw[f"{s}_images"][n], raw[f"{s}_labels"][n], resize)
        for s in ("train", "test")
    ]
    return tuple(
        torch.utils.data.DataLoader(d, batch_size, shuffle=shuffle, num_workers=num_workers)
        for d, shuffle in zip(sets, (True, False), strict=True)
    )


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
