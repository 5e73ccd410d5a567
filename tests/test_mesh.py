"""2-D device meshes (FSDP2 over "dp" x tensor parallelism over "tp") on gloo: 2x2, 2x1 and 1x2
training equal one device in float64 (losses, parameters, 1e-10); a negative control (tp ranks
of one dp group given different data); held bytes and reduce-scatter bytes equal the
prediction; bfloat16 gathers half the bytes; a distributed checkpoint saved on 2x2 read into
1x2, 2x1 and one process exactly (control: qkv rows not regrouped), and training on from it
equals one device trained for all steps; bad dp x tp."""

import dataclasses
import warnings

import pytest
import torch
from conftest import newer_torch

from d2l_gpu.parallel import mesh as M
from d2l_gpu.parallel import workload
from d2l_gpu.workers import run_workers

pytestmark = newer_torch(2, 6, "fully_shard (FSDP2) on a CPU, the mesh's dp dimension")
WORK = workload.TransformerWorkload(steps=3)  # vocab 32, d_model 16, 4 heads, 2 layers, batch 2
MORE = 2  # steps trained on after loading the checkpoint


def _wrong_part(X, mesh):
    """The bug: the batch split by the tp coordinate, so tp ranks of one group differ."""
    return X.tensor_split(mesh["dp"].size())[mesh.get_local_rank("tp")]


def four_ranks(rank, world, path):
    """2x2: train, save the checkpoint; then the broken run."""
    out = {"2x2": M.mesh_save_worker(rank, world, WORK, 2, 2, path)}
    M.batch_part = _wrong_part  # this process only
    out["wrong data"] = M.mesh_worker(rank, world, WORK, 2, 2)
    return out


def two_ranks(rank, world, path):
    """2x1 and 1x2 training; the 2x2 checkpoint read into both and trained on MORE steps."""
    out = {f"{dp}x{tp}": M.mesh_worker(rank, world, WORK, dp, tp) for dp, tp in [(2, 1), (1, 2)]}
    for dp, tp in [(2, 1), (1, 2)]:
        out[f"load {dp}x{tp}"] = M.mesh_resume_worker(rank, world, WORK, dp, tp, path, MORE)
    fp32 = dataclasses.replace(WORK, dtype=torch.float32)
    out["float32"] = M.step_collectives_worker(rank, world, fp32, 2, 1)
    out["bfloat16"] = M.step_collectives_worker(rank, world, fp32, 2, 1, torch.bfloat16)
    try:
        M.mesh_worker(rank, world, WORK, 2, 2)
    except ValueError as e:
        out["error"] = str(e)
    return out


def one_device(steps):
    net = WORK.model()
    X, y = WORK.data()
    losses = workload.train_transformer(net, X, y, steps, WORK.lr)
    return losses, [p.detach().clone() for p in net.parameters()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("dcp") / "ckpt")
    four = run_workers(four_ranks, 4, path, backend="gloo", timeout=240)
    two = run_workers(two_ranks, 2, path, backend="gloo", timeout=240)
    net, kept = WORK.model(), WORK.model()  # one process, no process group: read whole
    with warnings.catch_warnings():  # DCP warns that it reads in one process
        warnings.simplefilter("ignore", UserWarning)
        M.load_sharded(net, path, tp=1)
        M.load_sharded(kept, path, tp=2)  # the bug: qkv's rows left grouped as for tp=2
    return {
        4: four,
        2: two,
        "one": [p.detach().clone() for p in net.parameters()],
        "not regrouped": [p.detach().clone() for p in kept.parameters()],
    }


def max_diff(xs, ys) -> float:
    return max((a - b).abs().max().item() for a, b in zip(xs, ys, strict=True))


@pytest.mark.parametrize(("world", "layout"), [(4, "2x2"), (2, "2x1"), (2, "1x2")])
def test_mesh_equals_one_device(runs, world, layout):
    losses, params = one_device(WORK.steps)
    for r in runs[world]:
        assert max(abs(a - b) for a, b in zip(r[layout]["losses"], losses, strict=True)) < 1e-10
        assert max_diff(r[layout]["params"], params) < 1e-10


def test_tp_ranks_given_different_data_is_caught(runs):
    _, params = one_device(WORK.steps)
    assert max_diff(runs[4][0]["wrong data"]["params"], params) > 1e-3


@pytest.mark.parametrize(
    ("world", "layout", "dp", "tp"), [(4, "2x2", 2, 2), (2, "2x1", 2, 1), (2, "1x2", 1, 2)]
)
def test_held_bytes_and_reduce_scatter_equal_prediction(runs, world, layout, dp, tp):
    predicted = M.predict_mesh(WORK, dp, tp)
    for r in runs[world]:
        assert r[layout]["held"] == predicted["held"]
        assert r[layout]["bytes"].get("reduce_scatter", 0) == predicted["reduce_scatter"]
        assert (r[layout]["calls"].get("all_gather", 0) > 0) == (dp > 1)  # FSDP's gathers
        assert (r[layout]["calls"].get("all_reduce", 0) > 4 * WORK.num_layers) == (tp > 1)


def test_held_bytes_fall_with_mesh_size(runs):
    whole = sum(p.numel() * 8 for p in WORK.model().parameters())
    assert M.predict_mesh(WORK, 1, 1)["held"] == whole
    assert runs[4][0]["2x2"]["held"] < runs[2][0]["2x1"]["held"] < whole


def test_checkpoint_reshards_exactly(runs):
    saved = runs[4][0]["2x2"]["params"]
    for layout in ("load 2x1", "load 1x2"):
        for r in runs[2]:
            assert max_diff(r[layout]["loaded"], saved) == 0
    assert max_diff(runs["one"], saved) == 0
    assert max_diff(runs["not regrouped"], saved) > 1e-2  # the control: qkv rows misplaced


def test_training_on_after_loading_equals_one_device(runs):
    _, params = one_device(WORK.steps + MORE)
    for layout in ("load 2x1", "load 1x2"):
        for r in runs[2]:
            assert max_diff(r[layout]["params"], params) < 1e-10


def test_checkpoint_paths_are_checked_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="must not exist yet"):
        M.mesh_save_worker(0, 1, WORK, 1, 1, str(tmp_path))
    with pytest.raises(ValueError, match="no .metadata file"):
        M.mesh_resume_worker(0, 1, WORK, 1, 1, str(tmp_path), 1)


def test_bad_mesh_shape(runs):
    message = runs[2][0]["error"]
    assert "dp=2" in message and "tp=2" in message and "world=2" in message
    with pytest.raises(ValueError, match="dp=3 times tp=1"):
        M.check_mesh("x", 2, 3, 1)


def test_bfloat16_gathers_half_the_bytes(runs):
    """FSDP2 MixedPrecisionPolicy(bfloat16 params, float32 reduce) on the dp mesh, gloo CPU."""
    fp32, bf16 = runs[2][0]["float32"], runs[2][0]["bfloat16"]
    assert fp32["calls"] == bf16["calls"]
    assert bf16["bytes"]["all_gather"] * 2 == fp32["bytes"]["all_gather"]
    assert bf16["bytes"]["reduce_scatter"] == fp32["bytes"]["reduce_scatter"]
