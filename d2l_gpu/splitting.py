"""Three ways to split a network over k devices (by data, by layers, by channels), what each
costs, counted unit by unit, and the small models the lessons split.

Shown in lesson 9 (lesson 10 reuses the models).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from .models import lenet_params


def mlp(widths: list[int], seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """Linear layers of the given widths with a ReLU between them, seeded (lessons 9 and 10)."""
    if len(widths) < 2:
        raise ValueError(f"mlp needs at least an input and an output width, got {widths}")
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).to(dtype)


def lenet_sequential(seed: int = 0, scale: float = 0.1) -> nn.Sequential:
    """Lesson 5's LeNet as an nn.Sequential (same weights as `lenet_params(seed, scale)`)."""
    params = lenet_params(seed, scale)
    net = nn.Sequential(
        nn.Conv2d(1, 20, 3),
        nn.ReLU(),
        nn.AvgPool2d(2),
        nn.Conv2d(20, 50, 5),
        nn.ReLU(),
        nn.AvgPool2d(2),
        nn.Flatten(),
        nn.Linear(800, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )
    weights = [params[0], params[1], params[2], params[3]]
    weights += [params[4].T, params[5], params[6].T, params[7]]  # nn.Linear stores W transposed
    with torch.no_grad():
        for p, w in zip(net.parameters(), weights, strict=True):
            p.copy_(w)
    return net


class TransformerBlock(nn.Module):
    """A pre-norm transformer block: causal self-attention, then a two-layer MLP; residuals."""

    def __init__(self, d_model: int = 256, num_heads: int = 4, ffn: int | None = None):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not a multiple of num_heads={num_heads}")
        self.num_heads = num_heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.fc1 = nn.Linear(d_model, ffn or 4 * d_model)
        self.fc2 = nn.Linear(ffn or 4 * d_model, d_model)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        B, T, D = X.shape
        q, k, v = self.qkv(self.ln1(X)).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.num_heads, -1).transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        X = X + self.proj(att.transpose(1, 2).reshape(B, T, D))
        return X + self.fc2(F.gelu(self.fc1(self.ln2(X))))


def transformer(
    vocab: int = 1000, d_model: int = 256, num_heads: int = 4, num_layers: int = 4, seed: int = 0
) -> nn.Sequential:
    """A small decoder-only language model: embedding, transformer blocks, norm, output layer."""
    torch.manual_seed(seed)
    blocks = [TransformerBlock(d_model, num_heads) for _ in range(num_layers)]
    return nn.Sequential(
        nn.Embedding(vocab, d_model), *blocks, nn.LayerNorm(d_model), nn.Linear(d_model, vocab)
    )


def layer_table(net: nn.Sequential, X: torch.Tensor) -> list[dict]:
    """Per unit (child) of `net`: parameters, outputs per example, forward FLOPs per example."""
    rows, h, was_training = [], X, net.training
    net.eval()  # the same FLOPs, and BatchNorm's running statistics stay untouched
    with torch.no_grad():
        for name, unit in net.named_children():
            with FlopCounterMode(display=False) as counter:
                h = unit(h)
            rows.append(
                {
                    "name": f"{name}: {type(unit).__name__}",
                    "params": sum(p.numel() for p in unit.parameters()),
                    "out": h[0].numel(),
                    "flops": counter.get_total_flops() / len(X),
                }
            )
    net.train(was_training)
    return rows


def balanced_cuts(costs: list[float], k: int) -> list[int]:
    """Cut `costs` into k contiguous groups with the smallest largest sum; return the k+1 bounds."""
    n = len(costs)
    if not 1 <= k <= n:
        raise ValueError(f"cannot cut {n} units into {k} stages: need 1 <= stages <= {n}")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[j][i]: the smallest largest sum cutting units[:i] into j groups; how[j][i]: last cut
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    how = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for j in range(1, k + 1):
        for i in range(j, n + 1):
            for c in range(j - 1, i):
                value = max(best[j - 1][c], prefix[i] - prefix[c])
                if value < best[j][i]:
                    best[j][i], how[j][i] = value, c
    bounds, i = [n], n
    for j in range(k, 0, -1):
        i = how[j][i]
        bounds.append(i)
    return bounds[::-1]


def split_stages(net: nn.Sequential, k: int, costs: list[float] | None = None) -> list:
    """Cut `net` into k consecutive stages (copies), balancing `costs` (default: unit counts)."""
    units = list(net.children())
    bounds = balanced_cuts(costs if costs is not None else [1.0] * len(units), k)
    pairs = zip(bounds, bounds[1:], strict=False)
    return [copy.deepcopy(nn.Sequential(*units[a:b])) for a, b in pairs]


def split_costs(net: nn.Sequential, X: torch.Tensor, k: int, bytes_per_number: int = 4) -> dict:
    """Per device and step, for batch X on k devices: parameters, FLOPs, bytes sent, by strategy."""
    rows = layer_table(net, X[:1])
    B, b = len(X), bytes_per_number
    P = sum(r["params"] for r in rows)
    flops = [r["flops"] * B for r in rows]
    bounds = balanced_cuts(flops, k)
    stages = list(zip(bounds, bounds[1:], strict=False))
    # layers: a stage sends its output forward and the gradient of its input backward
    sends = [
        (rows[b_ - 1]["out"] if b_ < len(rows) else 0) + (rows[a - 1]["out"] if a > 0 else 0)
        for a, b_ in stages
    ]
    acts = sum(r["out"] for r in rows)
    frac = (k - 1) / k
    return {
        "data": {
            "params": P,
            "flops": sum(flops) / k,
            "bytes_sent": 2 * frac * P * b,  # a ring all-reduce of every gradient
        },
        "layers": {
            "params": max(sum(r["params"] for r in rows[a:b_]) for a, b_ in stages),
            "flops": max(sum(flops[a:b_]) for a, b_ in stages),
            "bytes_sent": max(sends) * B * b,
        },
        "channels": {
            "params": P / k,
            "flops": sum(flops) / k,
            "bytes_sent": 2 * frac * acts * B * b,  # gather each output, reduce each input grad
        },
    }


def toy_data(
    n: int, d_in: int, num_classes: int, seed: int = 0, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """n random examples with d_in features and random labels: a workload, not a data set."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d_in, generator=g, dtype=dtype)
    return X, torch.randint(0, num_classes, (n,), generator=g)


def toy_images(
    n: int, seed: int = 0, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """n random 28x28 one-channel images with random labels 0..9 (for LeNet-shaped workloads)."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 1, 28, 28, generator=g, dtype=dtype)
    return X, torch.randint(0, 10, (n,), generator=g)


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
    opt, losses = make_optimizer(net.parameters(), optimizer, lr), []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(net(X), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
