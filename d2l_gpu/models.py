"""Every model of the lessons, each defined once: LeNet (functional, as a module, as layers),
ResNet-18 (with Residual blocks) and an MLP; the small transformer is in gpt.py.

Shown in lessons 5 (lenet, lenet_params, LeNet), 6 (resnet18, resnet_block,
materialize, has_lazy, init_weights, init_every_layer), 7 (LeNet under DDP, lenet_blocks in the
pipeline strategy) and 10 (mlp, lenet_sequential).
"""

from __future__ import annotations

import inspect

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from . import _checks
from ._typed import wrap_public
from .devices import is_out_of_memory


def _form_1_0(num_channels, use_1x1conv=False, strides=1):
    """Residual's d2l 1.0 signature: lazy layers, input channels found at the first call."""


def _form_0_17(input_channels, num_channels, use_1x1conv=False, strides=1):
    """Residual's d2l 0.17 (and Chinese edition) signature: input channels given."""


def _residual_args(args: tuple, kwargs: dict) -> dict:
    """Bind Residual's arguments to the 0.17 form (two leading integers) or the 1.0 form."""
    second = args[1] if len(args) > 1 else None
    old = (
        "input_channels" in kwargs
        or (isinstance(second, int) and not isinstance(second, bool))
        or (len(args) == 1 and "num_channels" in kwargs)
    )
    form = _form_0_17 if old else _form_1_0
    try:
        bound = inspect.signature(form).bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(
            f"Residual{_call_text(args, kwargs)}: {e}. Residual takes either the d2l 1.0 form "
            "Residual(num_channels, use_1x1conv=False, strides=1) or the 0.17 form "
            "Residual(input_channels, num_channels, use_1x1conv=False, strides=1)"
        ) from None
    bound.apply_defaults()
    spec = dict(bound.arguments)
    for name in ("input_channels", "num_channels"):
        if name in spec:
            _checks.whole(f"Residual{_call_text(args, kwargs)}: {name}", spec[name])
    flag = spec["use_1x1conv"]
    if not isinstance(flag, (bool, np.bool_)):
        hint = " (two leading integers mean the 0.17 form)" if "use_1x1conv" not in kwargs else ""
        raise TypeError(
            f"Residual{_call_text(args, kwargs)}: use_1x1conv must be True or False, got "
            f"{flag!r}{hint}"
        )
    return spec


def _call_text(args: tuple, kwargs: dict) -> str:
    """How the call was written, for error messages."""
    return "(" + ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())]) + ")"


class Residual(nn.Module):
    """The Residual block of ResNet models, in either edition's signature.

    `Residual(num_channels, use_1x1conv=False, strides=1)` is d2l 1.0's (lazy layers);
    `Residual(input_channels, num_channels, use_1x1conv=False, strides=1)` is 0.17's and the
    Chinese edition's (eager layers): two leading integers mean the 0.17 form, so
    `Residual(3, 3)` maps 3 channels to 3 with an identity shortcut.
    """

    def __init__(self, *args, **kwargs):
        super().__init__()
        spec = _residual_args(args, kwargs)
        c_in, c, strides = spec.get("input_channels"), spec["num_channels"], spec["strides"]

        def conv(in_channels, **options):
            if in_channels is None:
                return nn.LazyConv2d(c, **options)
            return nn.Conv2d(in_channels, c, **options)

        self.conv1 = conv(c_in, kernel_size=3, padding=1, stride=strides)
        self.conv2 = conv(None if c_in is None else c, kernel_size=3, padding=1)
        if spec["use_1x1conv"]:
            self.conv3 = conv(c_in, kernel_size=1, stride=strides)
        else:
            self.conv3 = None
        self.bn1 = nn.LazyBatchNorm2d() if c_in is None else nn.BatchNorm2d(c)
        self.bn2 = nn.LazyBatchNorm2d() if c_in is None else nn.BatchNorm2d(c)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3:
            X = self.conv3(X)
        Y += X
        return F.relu(Y)


def resnet_block(num_channels: int, num_residuals: int, first_block: bool = False) -> nn.Sequential:
    """A stage of ResNet: `num_residuals` Residual blocks; all but the first stage halve H and W."""
    _checks.whole("resnet_block: num_channels", num_channels, most=2**16)
    _checks.whole("resnet_block: num_residuals", num_residuals, most=1000)  # modules, not weights
    blk = []
    for i in range(num_residuals):
        if i == 0 and not first_block:
            blk.append(Residual(num_channels, use_1x1conv=True, strides=2))
        else:
            blk.append(Residual(num_channels))
    return nn.Sequential(*blk)


def resnet18(num_classes: int = 10, in_channels: int = 1) -> nn.Sequential:
    """A slightly modified ResNet-18 model (3x3 stem, no max-pooling) for small images."""
    _checks.whole("resnet18: num_classes", num_classes)
    _checks.whole("resnet18: in_channels", in_channels)
    net = nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
    )
    net.add_module("resnet_block1", resnet_block(64, 2, first_block=True))
    net.add_module("resnet_block2", resnet_block(128, 2))
    net.add_module("resnet_block3", resnet_block(256, 2))
    net.add_module("resnet_block4", resnet_block(512, 2))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes)))
    return net


def materialize(
    net: nn.Module,
    shape: tuple[int, ...] = (1, 1, 28, 28),
    device: torch.device | str | None = None,
) -> nn.Module:
    """Give every lazy layer its real shape by running one dummy batch (running stats untouched)."""
    was_training = net.training
    net.eval()
    try:
        with torch.no_grad():
            net(torch.zeros(shape, device=device))
    except RuntimeError as e:
        if is_out_of_memory(e):
            raise
        raise ValueError(
            f"materialize: a dummy batch of shape {tuple(shape)} does not fit net "
            f"({str(e).strip().splitlines()[0]}); pass the shape of a batch of one, e.g. "
            "(1, 1, 28, 28), on the device net is on"
        ) from None
    finally:
        net.train(was_training)
    return net


def has_lazy(net: nn.Module) -> bool:
    """True if some layer of `net` is still lazy (its parameters have no shape yet)."""
    return any(isinstance(m, nn.modules.lazy.LazyModuleMixin) for m in net.modules())


def init_weights(module: nn.Module) -> None:
    """The book's initialisation: N(0, 0.01) weights for every Linear and Conv2d layer."""
    if isinstance(module, nn.modules.lazy.LazyModuleMixin):
        raise RuntimeError(
            f"init_weights got a lazy {type(module).__name__}: its weights do not exist yet; "
            "call d2l.materialize(net, shape) first, so every layer is initialised"
        )
    if type(module) in [nn.Linear, nn.Conv2d]:
        nn.init.normal_(module.weight, std=0.01)


def init_every_layer(
    net: nn.Module, shape=(1, 1, 28, 28), device=None, init=init_weights
) -> nn.Module:
    """Materialise the lazy layers with a dummy batch of `shape`, then apply `init` to all."""
    materialize(net, shape, device)
    net.apply(init)
    return net


def lenet_params(seed: int | None = None, scale: float = 0.01) -> list[torch.Tensor]:
    """The LeNet parameters of the data-parallel chapter, drawn from N(0, scale^2)."""
    g = torch.Generator().manual_seed(seed) if seed is not None else None
    shapes = [(20, 1, 3, 3), (50, 20, 5, 5), (800, 128), (128, 10)]
    params = []
    for shape in shapes:
        params.append(torch.randn(shape, generator=g) * scale)
        params.append(torch.zeros(shape[0] if len(shape) == 4 else shape[1]))
    return params


def lenet(X: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    """LeNet written from its parameter list: conv-relu-pool twice, then two dense layers."""
    h1_conv = F.conv2d(input=X, weight=params[0], bias=params[1])
    h1_activation = F.relu(h1_conv)
    h1 = F.avg_pool2d(input=h1_activation, kernel_size=(2, 2), stride=(2, 2))
    h2_conv = F.conv2d(input=h1, weight=params[2], bias=params[3])
    h2_activation = F.relu(h2_conv)
    h2 = F.avg_pool2d(input=h2_activation, kernel_size=(2, 2), stride=(2, 2))
    h2 = h2.reshape(h2.shape[0], -1)
    h3_linear = torch.mm(h2, params[4]) + params[5]
    h3 = F.relu(h3_linear)
    y_hat = torch.mm(h3, params[6]) + params[7]
    return y_hat


class LeNet(nn.Module):
    """The functional LeNet as an nn.Module, so that DDP (lesson 7) can find its parameters."""

    def __init__(self, seed: int | None = None, scale: float = 0.1):
        super().__init__()  # scale 0.1: with the chapter's 0.01 the first epochs barely learn
        self.params = nn.ParameterList(lenet_params(seed, scale))

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return lenet(X, list(self.params))


def mlp(widths: list[int], seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """Linear layers of the given widths with a ReLU between them, seeded (lessons 10 and 11)."""
    widths = _checks.items("mlp: widths", widths, least=0)
    if len(widths) < 2:
        raise ValueError(f"mlp needs at least an input and an output width, got {widths}")
    for w in widths:
        _checks.whole("mlp: each of widths", w)
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).to(dtype)


def _lenet_params(caller: str, params) -> None:
    """Refuse a parameter list that is not LeNet's 8 tensors (weights and biases of 4 layers)."""
    if not isinstance(params, (list, tuple)) or len(params) != 8:
        what = f"{len(params)} items" if isinstance(params, (list, tuple)) else repr(params)
        raise ValueError(
            f"{caller}: params must be the 8 tensors of d2l.lenet_params(), got {what}"
        )


def lenet_blocks(params: list[torch.Tensor]) -> nn.Sequential:
    """LeNet as four nn.Sequential layers with copies of `params` (cut by lesson 7's pipeline)."""
    _lenet_params("lenet_blocks", params)
    net = nn.Sequential(
        nn.Sequential(nn.Conv2d(1, 20, 3), nn.ReLU(), nn.AvgPool2d(2)),
        nn.Sequential(nn.Conv2d(20, 50, 5), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten()),
        nn.Sequential(nn.Linear(800, 128), nn.ReLU()),
        nn.Sequential(nn.Linear(128, 10)),
    ).to(device=params[0].device, dtype=params[0].dtype)
    with torch.no_grad():
        for p, w in zip(net.parameters(), params, strict=True):
            p.copy_(w.T if p.dim() == 2 else w)  # nn.Linear stores W transposed
    return net


def lenet_sequential(seed: int = 0, scale: float = 0.1) -> nn.Sequential:
    """The LeNet of lesson 5 as one flat nn.Sequential, with the weights of `lenet_params`.

    Shown in lesson 10, which cuts it into pipeline stages."""
    return nn.Sequential(
        *(layer for block in lenet_blocks(lenet_params(seed, scale)) for layer in block)
    )


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
