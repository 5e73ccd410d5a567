"""benchmarks/resnet_fast.py and lenet_seeds.py: what their GPU figures rest on, checked on a CPU.

The GPU report of 2026-11-30 (reports/gpu/2026-11-30-h200.md) trains the fastest row three times
on one Trainer, resetting it in place between seeds so that a captured CUDA graph stays valid.
That reset must give exactly the run a fresh Trainer gives; the schedule must warm up and decay
as the report says; and bad options must be one-sentence errors.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys

import pytest
import torch
from conftest import ROOT


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fast():
    return load("resnet_fast")


def batches(n: int = 3, b: int = 8):
    g = torch.Generator().manual_seed(0)
    X = torch.randint(0, 256, (n * b, 28, 28), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (n * b,), generator=g)
    return [(X[i * b : (i + 1) * b], y[i * b : (i + 1) * b]) for i in range(n)]


def losses(trainer, data):
    return [float(trainer.step(X, y, 0.05)) for X, y in data]


def test_a_trainer_reset_in_place_runs_exactly_as_a_fresh_one(fast):
    setup = fast.Setup(batch=8, read_loss=False)
    data = batches()
    device = torch.device("cpu")
    fresh = fast.Trainer(setup, device, *data[0], seed=1)
    want = losses(fresh, data)
    reused = fast.Trainer(setup, device, *data[0], seed=0)
    losses(reused, data)  # momentum buffers and BatchNorm statistics now hold a run
    reused.reset(1)
    assert losses(reused, data) == want


def test_a_reset_that_kept_the_momentum_would_differ(fast):  # negative control
    setup = fast.Setup(batch=8, read_loss=False)
    data = batches()
    device = torch.device("cpu")
    want = losses(fast.Trainer(setup, device, *data[0], seed=1), data)
    reused = fast.Trainer(setup, device, *data[0], seed=0)
    losses(reused, data)
    momentum = [s["momentum_buffer"].clone() for s in reused.opt.state.values()]
    reused.reset(1)
    for state, kept in zip(reused.opt.state.values(), momentum, strict=True):
        state["momentum_buffer"].copy_(kept)
    assert losses(reused, data) != want


def test_the_schedule_warms_up_then_decays_to_zero(fast):
    total, peak = 600, 0.4
    lrs = [fast.lr_at(i, total, peak) for i in range(total)]
    assert lrs[0] == pytest.approx(peak / 60) and lrs[59] == pytest.approx(peak)
    assert all(a < b for a, b in zip(lrs[:59], lrs[1:60], strict=True))
    assert all(a >= b for a, b in zip(lrs[59:-1], lrs[60:], strict=True))
    assert 0 < lrs[-1] < peak * (1 - math.cos(math.pi / 540))


@pytest.mark.parametrize("argv, words", [
    (["--rows", "1,x"], "comma-separated whole numbers"),
    (["--rows", "11"], "no row 11"),
    (["--train", "0"], "no row 0"),
])  # fmt: skip
def test_bad_options_are_one_sentence(fast, argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        fast.parse_args(argv)
    assert e.value.code == 2 and words in capsys.readouterr().err


def test_cuda_graph_rows_say_why_they_are_skipped_on_a_cpu(fast, tmp_path, monkeypatch):
    monkeypatch.setattr(fast, "load", lambda device, limit: [t[:16] for t in _tiny()])
    out = tmp_path / "r.json"
    assert fast.main(["--rows", "9", "--epochs", "0", "--device", "cpu", "--json", str(out)]) == 0
    row = json.loads(out.read_text())["rows"][0]
    assert row["skipped"] == "CUDA graphs need a CUDA device" and "images_per_sec" not in row


def _tiny():
    X = torch.zeros(16, 28, 28, dtype=torch.uint8)
    y = torch.zeros(16, dtype=torch.long)
    return X, y, X, y


def test_lenet_seeds_rejects_a_bad_list(capsys):
    seeds = load("lenet_seeds")
    with pytest.raises(SystemExit) as e:
        seeds.main(["--lrs", "0.2,fast"])
    assert e.value.code == 2 and "comma-separated numbers" in capsys.readouterr().err
