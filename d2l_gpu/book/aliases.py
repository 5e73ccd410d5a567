"""The book's framework-neutral tensor names (d2l.randn, d2l.to, d2l.size, ...) for PyTorch.

The book writes its shared code once for several frameworks, through these names; with
`import d2l_gpu as d2l` they mean what they mean in the book's PyTorch edition. One fix:
`numpy(x)` also works on accelerator tensors (it copies to the host first).
"""

from __future__ import annotations

import torch

ones_like = torch.ones_like
ones = torch.ones
zeros_like = torch.zeros_like
zeros = torch.zeros
tensor = torch.tensor
arange = torch.arange
meshgrid = torch.meshgrid
sin = torch.sin
sinh = torch.sinh
cos = torch.cos
cosh = torch.cosh
tanh = torch.tanh
linspace = torch.linspace
exp = torch.exp
log = torch.log
normal = torch.normal
rand = torch.rand
randn = torch.randn
matmul = torch.matmul
int32 = torch.int32
int64 = torch.int64
float32 = torch.float32
concat = torch.cat
stack = torch.stack
abs = torch.abs  # noqa: A001 - the book's name
eye = torch.eye
sigmoid = torch.sigmoid
batch_matmul = torch.bmm


def numpy(x: torch.Tensor, *args, **kwargs):
    """x as a NumPy array (from any device: the book's fails on accelerator tensors)."""
    return x.detach().cpu().numpy(*args, **kwargs)


def size(x: torch.Tensor, *args, **kwargs) -> int:
    """Number of elements of x."""
    return x.numel(*args, **kwargs)


def reshape(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """x.reshape(...)."""
    return x.reshape(*args, **kwargs)


def to(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """x.to(...): move to a device or change the dtype."""
    return x.to(*args, **kwargs)


def reduce_sum(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """x.sum(...)."""
    return x.sum(*args, **kwargs)


def reduce_mean(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """x.mean(...)."""
    return x.mean(*args, **kwargs)


def argmax(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """x.argmax(...)."""
    return x.argmax(*args, **kwargs)


def astype(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """x.type(...): x converted to another dtype."""
    return x.type(*args, **kwargs)


def transpose(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """x.t(...): a 2-d transpose."""
    return x.t(*args, **kwargs)


def expand_dims(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """x.unsqueeze(...)."""
    return x.unsqueeze(*args, **kwargs)


def swapaxes(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """x.swapaxes(...)."""
    return x.swapaxes(*args, **kwargs)


def repeat(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """x.repeat(...)."""
    return x.repeat(*args, **kwargs)
