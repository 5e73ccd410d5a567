"""BatchNorm over the examples of every rank, on any device (lesson 7).

Under data parallelism each rank sees only its part of a batch, so a plain BatchNorm layer
normalises with that part's mean and variance, and the world size changes the model. PyTorch's
`nn.SyncBatchNorm` computes the statistics over all ranks, but only on CUDA (and XPU, HPU)
tensors. `GlobalBatchNorm` does the same with two all-reduces of per-channel sums, which run on
any backend (gloo on CPU processes here); a small autograd function sums their gradients over
the ranks with two more all-reduces in the backward pass. `sync_batchnorm` picks PyTorch's layer
where it runs and this one elsewhere: the training script's `--sync-bn`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .. import _checks
from .._typed import wrap_public
from ..models import has_lazy

__all__ = ["GlobalBatchNorm", "sync_batchnorm"]

SYNC_BN_DEVICES = ("cuda", "xpu", "hpu")  # where PyTorch's SyncBatchNorm has kernels
BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class _AllReduceBothWays(torch.autograd.Function):
    """all_reduce(SUM) that autograd can go through: the backward sums the gradients too."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        total = x.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # every rank's loss depends on every rank's sums: each input gets all ranks' gradients
        total = grad.clone()
        dist.all_reduce(total, group=ctx.group)
        return total, None


class GlobalBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics cover every rank's examples (any device, any backend)."""

    def __init__(self, num_features: int, *, group=None, **kwargs):
        _checks.whole("GlobalBatchNorm: num_features", num_features)
        super().__init__(num_features, **kwargs)
        self.group = group  # None: every rank of the default group

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            shape = tuple(input.shape)
            raise ValueError(f"GlobalBatchNorm needs (N, C, ...) input, got shape {shape}")

    def _synced(self) -> bool:
        return (
            self.training
            and dist.is_available()
            and dist.is_initialized()
            and dist.get_world_size(self.group) > 1
        )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalise `input` with the mean and variance of the whole global batch."""
        if not self._synced():  # evaluation, or one process: the ordinary layer
            return super().forward(input)
        self._check_input_dim(input)
        channels = input.shape[1]
        dims = [0, *range(2, input.dim())]
        shape = [1, channels] + [1] * (input.dim() - 2)
        count = input.new_tensor([input.numel() // channels])  # this rank's examples x positions
        group = self.group or dist.group.WORLD
        # all-reduce 1: the sum of every channel and the number of values, over all ranks
        sums = _AllReduceBothWays.apply(torch.cat([input.sum(dims), count]), group)
        n = sums[-1].detach()
        if n <= 1:  # as nn.BatchNorm: one value per channel has no variance
            raise ValueError(f"GlobalBatchNorm needs more than 1 value per channel, got {int(n)}")
        mean = sums[:-1] / n
        centred = input - mean.view(shape)
        # all-reduce 2: the sum of squared deviations (two passes: no cancellation in float32)
        var = _AllReduceBothWays.apply((centred * centred).sum(dims), group) / n
        out = centred * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        if self.track_running_stats:
            self._update_running(mean.detach(), var.detach(), n)
        return out

    @torch.no_grad()
    def _update_running(self, mean: torch.Tensor, var: torch.Tensor, n: torch.Tensor) -> None:
        """Running statistics as nn.BatchNorm keeps them: the unbiased variance, same momentum."""
        self.num_batches_tracked += 1
        factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        self.running_mean.mul_(1 - factor).add_(mean, alpha=factor)
        self.running_var.mul_(1 - factor).add_(var * n / (n - 1), alpha=factor)


def sync_batchnorm(net: nn.Module, device: torch.device, group=None) -> nn.Module:
    """`net` with every BatchNorm synced over ranks: PyTorch's on CUDA, ours elsewhere."""
    if has_lazy(net):  # a lazy BatchNorm does not know its channels yet
        raise ValueError(
            "sync_batchnorm got a model with lazy layers: call d2l.materialize(net, shape) first"
        )
    if _checks.device("sync_batchnorm: device", device).type in SYNC_BN_DEVICES:
        return nn.SyncBatchNorm.convert_sync_batchnorm(net, group)
    return _convert(net, group)


def _convert(module: nn.Module, group) -> nn.Module:
    """Replace every BatchNorm layer in `module` (or `module` itself) by a GlobalBatchNorm."""
    if isinstance(module, BATCHNORMS):
        layer = GlobalBatchNorm(
            module.num_features, group=group, eps=module.eps, momentum=module.momentum,
            affine=module.affine, track_running_stats=module.track_running_stats,
        )  # fmt: skip
        for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
            setattr(layer, name, getattr(module, name))  # the same tensors: nothing is copied
        layer.train(module.training)
        return layer
    for name, child in module.named_children():
        module.add_module(name, _convert(child, group))
    return module


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
