"""Random workloads for the lessons that split a model (9 and 10): numbers, not a data set."""

from __future__ import annotations

import torch

from .. import _checks
from .._typed import wrap_public


def toy_data(
    n: int, d_in: int, num_classes: int, seed: int = 0, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """n random examples with d_in features and random labels: a workload, not a data set."""
    for name, value in (("n", n), ("d_in", d_in), ("num_classes", num_classes)):
        _checks.whole(f"toy_data: {name}", value)
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d_in, generator=g, dtype=dtype)
    return X, torch.randint(0, num_classes, (n,), generator=g)


def toy_images(
    n: int, seed: int = 0, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """n random 28x28 one-channel images with random labels 0..9 (for LeNet-shaped workloads)."""
    _checks.whole("toy_images: n", n)
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 1, 28, 28, generator=g, dtype=dtype)
    return X, torch.randint(0, 10, (n,), generator=g)


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
