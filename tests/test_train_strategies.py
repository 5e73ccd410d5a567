"""`--strategy ddp|fsdp|pipeline|fsdp-tp`: each equals one process, each resumes a killed rank to
the uninterrupted result, each resumes the others' checkpoints and at another world size
(elastic), and bad combinations are refused. The same for `--model transformer`, which the 2-D
strategy (fsdp-tp: heads split over --tp ranks, FSDP over the rest) trains on 2 and 4 ranks.

Exactness is checked in float64 (--dtype float64), where 16 steps of rounding stay near 1e-16:
a difference above 1e-12 can only be a bug (a wrong shard, a missing micro-batch, a gradient
summed instead of averaged), never the hardware or the thread count.
"""

from __future__ import annotations

import pytest
from conftest import skip_strategies_this_torch_lacks
from train_launch import (
    ARGS,
    ARGS64,
    SCRIPT,
    load,
    max_diff,
    run_forked,
    run_here,
    run_with_a_kill,
    torchrun,
)

from d2l_gpu import train
from d2l_gpu.parallel.transformer_parallel import group_qkv

PARALLEL = ["fsdp", "pipeline"]  # ddp: tests/test_train_ranks.py
# 64 windows of 64 characters, 4 steps an epoch: 8 steps of the transformer in float64
TEXT = ["--model", "transformer", "--epochs", "2", "--batch-size", "16", "--lr", "0.5"]
TEXT += ["--seed", "3", "--limit", "64", "--dtype", "float64"]


@pytest.fixture(scope="module")
def one_transformer(job_env, tmp_path_factory) -> dict:
    """Final parameters of the float64 transformer job in one process (this interpreter)."""
    cwd = tmp_path_factory.mktemp("one-transformer")
    with pytest.MonkeyPatch.context() as monkeypatch:
        run_here([*TEXT, "--save", "final.pt"], job_env, cwd, monkeypatch)
    return load(cwd / "final.pt")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", PARALLEL)  # ddp: tests/test_train_ranks.py
@pytest.mark.parametrize("job", ["lenet", "transformer"])
def test_two_ranks_equal_one_process(job_env, tmp_path, request, job, strategy):
    skip_strategies_this_torch_lacks(strategy)
    args, reference = (ARGS64, "one_process") if job == "lenet" else (TEXT, "one_transformer")
    extra = ["--strategy", strategy, "--save", "final.pt"]
    code, out = run_forked(2, [*args, *extra], job_env, tmp_path)
    assert code == 0, out
    assert f"{job}: world size 2 (gloo, cpu, {strategy})" in out, out
    assert max_diff(load(tmp_path / "final.pt"), request.getfixturevalue(reference)) < 1e-12


@pytest.mark.slow
@pytest.mark.parametrize("strategy", PARALLEL)
def test_killed_rank_resumes_to_the_uninterrupted_result(job_env, tmp_path, one_process, strategy):
    skip_strategies_this_torch_lacks(strategy)
    extra = ["--strategy", strategy, "--checkpoint", "ckpt.pt", "--save", "final.pt"]

    def job(folder):
        cmd, env2 = torchrun(2, job_env, folder, "--max-restarts", "1")
        return [*cmd, *SCRIPT, *ARGS64, *extra], env2

    code, out, tmp_path = run_with_a_kill(job, tmp_path)
    assert code == 0, out
    assert "exitcode: -9" in out and "resumed from ckpt.pt: 1 of 2 epochs done" in out, out
    assert max_diff(load(tmp_path / "final.pt"), one_process) < 1e-12
    assert load(tmp_path / "ckpt.pt")["settings"]["strategy"] == strategy


@pytest.mark.parametrize(
    ("job", "first", "then"),
    [
        ("lenet", "ddp", "fsdp"),
        ("lenet", "fsdp", "pipeline"),
        ("lenet", "pipeline", "ddp"),
        ("transformer", "ddp", "fsdp-tp"),
        ("transformer", "fsdp-tp", "pipeline"),
    ],
)
def test_a_checkpoint_resumes_under_another_strategy(lone, tmp_path, capsys, job, first, then):
    """Full state dicts: epoch 1 under one strategy, epoch 2 under another = 2 epochs of ddp."""
    skip_strategies_this_torch_lacks(first, then)
    small = [*ARGS64, "--limit", "64"] if job == "lenet" else [*TEXT, "--limit", "32", "--tp", "1"]
    assert train.main([*small, "--save", str(tmp_path / "straight.pt")]) == 0
    ckpt = str(tmp_path / "ckpt.pt")
    assert train.main([*small, "--epochs", "1", "--strategy", first, "--checkpoint", ckpt]) == 0
    capsys.readouterr()
    final = str(tmp_path / "final.pt")
    assert train.main([*small, "--strategy", then, "--checkpoint", ckpt, "--save", final]) == 0
    out = capsys.readouterr().out
    assert f"continuing with --strategy {then} (the checkpoint's job had {first})" in out, out
    assert max_diff(load(tmp_path / "final.pt"), load(tmp_path / "straight.pt")) < 1e-12


@pytest.mark.parametrize(
    ("world", "extra", "message"),
    [
        (5, ["--strategy", "pipeline"], "cuts lenet into at most 4 stages (one layer each), but "
                                        "this job has 5 ranks"),
        (10, ["--strategy", "pipeline", "--model", "resnet18"], "at most 9 stages"),
        (1, ["--strategy", "pipeline", "--microbatches", "5"], "does not split into "
                                                               "--microbatches 5"),
        (4, ["--model", "transformer", "--strategy", "fsdp-tp", "--tp", "3"],
         "--tp 3 does not divide the world size 4"),
        (8, ["--model", "transformer", "--strategy", "fsdp-tp", "--tp", "8"],
         "--tp 8 ranks cannot share the 4 attention heads and 256 MLP units"),
    ],
)  # fmt: skip
def test_bad_combinations_refused_with_a_sentence(lone, monkeypatch, capsys, world, extra, message):
    skip_strategies_this_torch_lacks(extra[extra.index("--strategy") + 1])
    monkeypatch.setenv("WORLD_SIZE", str(world))  # checked before joining the group
    assert train.main([*ARGS, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


def test_old_pytorch_refused_with_the_version_needed(lone, monkeypatch, capsys):
    monkeypatch.setattr("torch.__version__", "2.4.1")
    for strategy in ("fsdp", "pipeline", "fsdp-tp"):
        assert train.main([*ARGS, "--model", "transformer", "--strategy", strategy]) == 2
        assert "needs PyTorch 2.6 or newer; this is 2.4.1" in capsys.readouterr().err


def _job(ranks: int, job_env: dict, folder, extra: list[str], monkeypatch) -> None:
    """The job on `ranks` processes (1: this interpreter, a group of one) in `folder`."""
    if ranks == 1:
        run_here([*ARGS64, *extra], job_env, folder, monkeypatch)
    else:
        code, out = run_forked(ranks, [*ARGS64, *extra], job_env, folder)
        assert code == 0, out


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", *PARALLEL])
@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_resumed_at_another_world_size_equals_the_uninterrupted_run(
    job_env, tmp_path, one_process, monkeypatch, strategy, before, after
):
    """An elastic job re-formed with fewer or more ranks: epoch 1 on `before`, 2 on `after`."""
    skip_strategies_this_torch_lacks(strategy)
    extra = ["--strategy", strategy, "--checkpoint", "ckpt.pt", "--save", "final.pt"]
    _job(before, job_env, tmp_path, [*extra, "--epochs", "1"], monkeypatch)
    assert load(tmp_path / "ckpt.pt")["world_size"] == before
    _job(after, job_env, tmp_path, extra, monkeypatch)
    assert max_diff(load(tmp_path / "final.pt"), one_process) < 1e-12


@pytest.mark.slow
def test_a_2x2_mesh_equals_one_process(job_env, tmp_path, one_transformer):
    """4 ranks as 2 rows of 2 (--tp 2): the heads split in two, FSDP over the rows."""
    skip_strategies_this_torch_lacks("fsdp-tp")
    extra = ["--strategy", "fsdp-tp", "--tp", "2", "--save", "final.pt"]
    code, out = run_forked(4, [*TEXT, *extra], job_env, tmp_path)
    assert code == 0, out
    assert "world size 4 (gloo, cpu, fsdp-tp)" in out and "global batch 16 = 2 x 8" in out, out
    final = load(tmp_path / "final.pt")
    assert max_diff(final, one_transformer) < 1e-12
    # negative control: qkv's rows as the split blocks keep them (grouped by rank) differ
    kept = {k: group_qkv(v, 2) if ".qkv." in k else v for k, v in final.items()}
    assert max_diff(kept, one_transformer) > 1e-3


@pytest.mark.slow
def test_a_checkpoint_resumes_on_a_2d_mesh(job_env, tmp_path, one_transformer, monkeypatch):
    """Epoch 1 in one process, epoch 2 on 2 ranks splitting the heads in two, each rank's part
    in 2 micro-batches: the checkpoint keeps qkv in the model's order, the mesh regroups it for
    its ranks, and FSDP's gradient sync waits for the last micro-batch."""
    skip_strategies_this_torch_lacks("fsdp-tp")
    extra = ["--strategy", "fsdp-tp", "--checkpoint", "ckpt.pt", "--save", "final.pt"]
    run_here([*TEXT, *extra, "--tp", "1", "--epochs", "1"], job_env, tmp_path, monkeypatch)
    code, out = run_forked(2, [*TEXT, *extra, "--tp", "2", "--accumulate", "2"], job_env, tmp_path)
    assert code == 0, out
    assert "continuing with --tp 2 (the checkpoint's job had 1)" in out, out
    assert max_diff(load(tmp_path / "final.pt"), one_transformer) < 1e-12


def test_a_forked_job_says_a_rank_that_failed(job_env, tmp_path):
    """The negative control of run_forked, which the equalities above launch with: a job that
    fails on its ranks returns their exit status and sentences, not a pass."""
    code, out = run_forked(2, [*ARGS, "--strategy", "pipeline", "--microbatches", "5"],
                           job_env, tmp_path)  # fmt: skip
    assert code == 2, out
    assert "does not split into --microbatches 5" in out and "Traceback" not in out, out
