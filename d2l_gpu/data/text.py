"""Text for the transformer lessons, shipped with Python itself: the help topics of Python's
documentation (the standard library's `pydoc_data.topics`, what `help("if")` prints), read one
character at a time. Nothing is downloaded. Shown in lesson 13.

The vocabulary is fixed (a newline and the 95 printable ASCII characters), so a token id means
the same on every Python version, although the text itself changes a little between versions.
"""

from __future__ import annotations

import torch

from .. import _checks
from .._typed import wrap_public

CHARS = "\n" + "".join(chr(c) for c in range(32, 127))  # 96 tokens
_IDS = {c: i for i, c in enumerate(CHARS)}
UNKNOWN = _IDS["?"]  # what a character outside CHARS becomes (curly quotes, dashes, ...)


def python_help_text() -> str:
    """The help topics of Python's documentation, joined in name order (about 460 kB)."""
    from pydoc_data.topics import topics  # part of the standard library

    return "\n\n".join(topics[name] for name in sorted(topics))


def encode(text: str) -> torch.Tensor:
    """Token ids (int64) of `text`, one per character; characters outside CHARS become '?'."""
    if not isinstance(text, str):
        raise TypeError(f"encode: text must be a str, got {type(text).__name__}")
    return torch.tensor([_IDS.get(c, UNKNOWN) for c in text], dtype=torch.int64)


def decode(ids: torch.Tensor | list[int]) -> str:
    """The characters of token ids (the inverse of `encode` on ASCII text)."""
    ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
    bad = [i for i in ids if not (isinstance(i, int) and 0 <= i < len(CHARS))]
    if bad:
        raise ValueError(f"decode: {bad[0]!r} is not a token id (0 to {len(CHARS) - 1})")
    return "".join(CHARS[i] for i in ids)


def text_batch(
    tokens: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch_size` windows of `seq_len` tokens at random places: inputs X and next tokens y."""
    _checks.whole("text_batch: batch_size", batch_size)
    _checks.whole("text_batch: seq_len", seq_len)
    if tokens.dim() != 1 or len(tokens) <= seq_len:
        raise ValueError(
            f"text_batch: tokens must be one sequence longer than seq_len={seq_len}, got shape "
            f"{tuple(tokens.shape)}"
        )
    starts = torch.randint(len(tokens) - seq_len, (batch_size,), generator=generator)
    windows = torch.stack([tokens[s : s + seq_len + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]


def char_windows(
    tokens: torch.Tensor, seq_len: int, test_share: float = 0.1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`tokens` cut into windows of `seq_len` + 1 that do not overlap: inputs and next tokens of
    the first windows for training, of the last `test_share` for testing (the training script's
    --model transformer, lesson 7)."""
    _checks.whole("char_windows: seq_len", seq_len)
    n = (len(tokens) - 1) // seq_len  # window i: tokens i*seq_len ... (i+1)*seq_len, inclusive
    n_test = int(n * test_share)
    if tokens.dim() != 1 or n - n_test < 1 or not 0 <= test_share < 1:
        raise ValueError(
            f"char_windows: need one sequence of more than {seq_len} tokens and 0 <= test_share "
            f"< 1, got shape {tuple(tokens.shape)} and test_share={test_share}"
        )
    starts = torch.arange(n) * seq_len
    windows = tokens[starts[:, None] + torch.arange(seq_len + 1)]
    X, y = windows[:, :-1], windows[:, 1:]
    return X[: n - n_test], y[: n - n_test], X[n - n_test :], y[n - n_test :]


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
