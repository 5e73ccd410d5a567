"""ResNet-18 and LeNet of the multi-GPU chapters; initialisation that covers every layer."""

import math

import pytest
import torch
from torch import nn

from d2l_gpu import models


def test_resnet18_shapes_and_size():
    net = models.materialize(models.resnet18(10, 1), (2, 1, 28, 28))
    assert not models.has_lazy(net)
    assert net(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    assert sum(p.numel() for p in net.parameters()) == 11_175_818
    net3 = models.materialize(models.resnet18(5, 3), (1, 3, 32, 32))
    assert net3(torch.zeros(1, 3, 32, 32)).shape == (1, 5)


def test_materialize_leaves_batchnorm_statistics_untouched():
    net = models.resnet18()
    models.materialize(net)
    bn = net[1]
    assert torch.equal(bn.running_mean, torch.zeros(64)) and int(bn.num_batches_tracked) == 0
    assert net.training


def test_book_init_skips_lazy_convs_but_ours_refuses():
    net = models.resnet18()
    lazy = sum(isinstance(m, nn.LazyConv2d) for m in net.modules())
    assert lazy == 19  # the book's `type(m) in [nn.Linear, nn.Conv2d]` silently skips all of them
    with pytest.raises(RuntimeError, match="materialize"):
        net.apply(models.init_weights)
    models.materialize(net).apply(models.init_weights)
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 20
    for c in convs:  # every conv got N(0, 0.01): within 6 standard errors of a sample std,
        # which PyTorch's default init (std 1/sqrt(3 fan_in), 0.0085 at fan_in 4608) misses
        assert abs(c.weight.std().item() - 0.01) < 6 * 0.01 / math.sqrt(2 * c.weight.numel())


def test_residual_block_shapes():
    X = torch.randn(4, 3, 6, 6)
    assert models.Residual(3)(X).shape == (4, 3, 6, 6)
    assert models.Residual(6, use_1x1conv=True, strides=2)(X).shape == (4, 6, 3, 3)


def test_lenet_params_and_forward():
    params = models.lenet_params(seed=0)
    assert [tuple(p.shape) for p in params] == [
        (20, 1, 3, 3),
        (20,),
        (50, 20, 5, 5),
        (50,),
        (800, 128),
        (128,),
        (128, 10),
        (10,),
    ]
    assert all(torch.equal(a, b) for a, b in zip(params, models.lenet_params(seed=0), strict=True))
    assert not torch.equal(params[0], models.lenet_params(seed=1)[0])
    assert models.lenet(torch.rand(3, 1, 28, 28), params).shape == (3, 10)
