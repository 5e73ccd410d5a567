"""The small decoder-only transformer of the lessons: pre-norm blocks of causal self-attention
and a two-layer MLP. Shown in lesson 11 (TransformerBlock, transformer), which counts its memory.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from . import _checks
from ._typed import wrap_public


class TransformerBlock(nn.Module):
    """A pre-norm transformer block: causal self-attention, then a two-layer MLP; residuals."""

    def __init__(self, d_model: int = 256, num_heads: int = 4, ffn: int | None = None):
        super().__init__()
        _checks.whole("TransformerBlock: d_model", d_model)
        _checks.whole("TransformerBlock: num_heads", num_heads)
        if ffn is not None:
            _checks.whole("TransformerBlock: ffn", ffn)
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
        att = self.attend(q, k, v)
        X = X + self.proj(att.transpose(1, 2).reshape(B, T, D))
        return X + self.fc2(F.gelu(self.fc1(self.ln2(X))))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of q, k, v [batch, heads, T, head_dim] (ring attention overrides it)."""
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def transformer(
    vocab: int = 1000, d_model: int = 256, num_heads: int = 4, num_layers: int = 4, seed: int = 0
) -> nn.Sequential:
    """A small decoder-only language model: embedding, transformer blocks, norm, output layer."""
    _checks.whole("transformer: vocab", vocab)
    _checks.whole("transformer: num_layers", num_layers, least=0)
    torch.manual_seed(seed)
    blocks = [TransformerBlock(d_model, num_heads) for _ in range(num_layers)]
    return nn.Sequential(
        nn.Embedding(vocab, d_model), *blocks, nn.LayerNorm(d_model), nn.Linear(d_model, vocab)
    )


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
