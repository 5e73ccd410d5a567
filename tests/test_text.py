"""The text corpus of lesson 13 (Python's help topics, one token per character): encode and
decode are inverses on ASCII, the vocabulary is fixed, batches are seeded windows whose targets
are the next characters; a tensor-parallel run on it equals one device; bad input is refused."""

import pytest
import torch

import d2l_gpu as d2l
from d2l_gpu.parallel import sequence_parallel as sp
from d2l_gpu.parallel import workload
from d2l_gpu.workers import run_workers


def test_the_text_ships_with_python_and_encodes_into_96_tokens():
    text = d2l.python_help_text()
    assert len(text) > 100_000 and "Assignment statements" in text
    tokens = d2l.encode(text)
    assert tokens.dtype == torch.int64 and len(tokens) == len(text)
    assert len(d2l.CHARS) == 96 and int(tokens.max()) < 96
    ascii_part = "def f(x):\n    return x + 1  # ~!@{}"
    assert d2l.decode(d2l.encode(ascii_part)) == ascii_part
    assert d2l.decode(d2l.encode("“é”")) == "???"  # outside the vocabulary


def test_a_batch_is_seeded_windows_and_their_next_characters():
    tokens = torch.arange(100)
    X, y = d2l.text_batch(tokens, 3, 10, torch.Generator().manual_seed(0))
    assert X.shape == y.shape == (3, 10)
    assert torch.equal(y[:, :-1], X[:, 1:]) and torch.equal(y[:, -1], X[:, -1] + 1)
    again = d2l.text_batch(tokens, 3, 10, torch.Generator().manual_seed(0))
    assert torch.equal(again[0], X)
    other = d2l.text_batch(tokens, 3, 10, torch.Generator().manual_seed(1))
    assert not torch.equal(other[0], X)  # the negative control: the seed matters


def test_the_training_script_cuts_the_text_into_windows_that_do_not_overlap():
    from d2l_gpu.data.text import char_windows

    X, y, X_test, y_test = char_windows(torch.arange(42), 10, test_share=0.25)
    assert X.shape == y.shape == (3, 10) and X_test.shape == y_test.shape == (1, 10)
    assert torch.equal(torch.cat([X, X_test]).flatten(), torch.arange(40))  # each token once
    assert torch.equal(torch.cat([y, y_test]).flatten(), torch.arange(1, 41))  # the next ones
    with pytest.raises(ValueError, match="more than 10 tokens"):
        char_windows(torch.arange(10), 10)


def test_tensor_parallel_on_the_text_equals_one_device():
    work = workload.TransformerWorkload(text=True, vocab=96, seq_len=16, steps=2)
    X, y = work.data()
    assert torch.equal(y[:, :-1], X[:, 1:])
    net = work.model()
    losses = workload.train_transformer(net, X, y, work.steps, work.lr)
    runs = run_workers(sp.transformer_parallel_worker, 2, work, "tp", backend="gloo")
    for r in runs:
        assert max(abs(a - b) for a, b in zip(r["losses"], losses, strict=True)) < 1e-10
        for a, b in zip(r["params"], net.parameters(), strict=True):
            assert (a - b).abs().max() < 1e-10


def test_bad_input():
    with pytest.raises(TypeError, match="encode: text must be a str"):
        d2l.encode(b"bytes")
    with pytest.raises(ValueError, match="decode: 96 is not a token id"):
        d2l.decode([1, 96])
    with pytest.raises(ValueError, match="longer than seq_len=10"):
        d2l.text_batch(torch.arange(10), 2, 10, torch.Generator())
    with pytest.raises(ValueError, match="vocab=32 is smaller than the text's 96 characters"):
        workload.TransformerWorkload(text=True)
