"""3-D device meshes (pipeline stages over "pp", each a 2-D mesh of FSDP2 over "dp" x tensor
parallelism over "tp") on 8 gloo processes: 2 x 2 x 2 with 2 micro-batches trains as one device
does in float64 (losses and every parameter, 1e-10); a negative control (micro-batch losses not
divided by their number); held bytes equal the prediction per stage, and the bytes sent between
stages equal the activations' size; bad layouts refused before any process group exists."""

import dataclasses
import types

import pytest
from conftest import newer_torch

from d2l_gpu.parallel import mesh3d, workload
from d2l_gpu.workers import run_workers

pytestmark = newer_torch(2, 6, "fully_shard (FSDP2) on a CPU, the mesh's dp dimension")
WORK = workload.TransformerWorkload(steps=3, batch_size=4)  # vocab 32, d_model 16, 2 layers
LAYOUT = (2, 2, 2, 2)  # pp, dp, tp, micro-batches


def unscaled_worker(rank, world, work, pp, dp, tp, m):
    """The bug: each micro-batch's loss is not divided by m, so the gradient is m times too big."""
    ce = mesh3d.F.cross_entropy
    mesh3d.F = types.SimpleNamespace(cross_entropy=lambda *a, **k: ce(*a, **k) * m)
    return mesh3d.mesh3d_worker(rank, world, work, pp, dp, tp, m)


def eight_ranks(rank, world):
    return {
        "3d": mesh3d.mesh3d_worker(rank, world, WORK, *LAYOUT),
        "unscaled": unscaled_worker(rank, world, WORK, *LAYOUT),
    }


@pytest.fixture(scope="module")
def runs():
    net = WORK.model()
    losses = workload.train_transformer(net, *WORK.data(), WORK.steps, WORK.lr)
    reference = (losses, [p.detach().clone() for p in net.parameters()])
    return reference, run_workers(eight_ranks, 8, backend="gloo", timeout=240)


def gap(run: list[dict], reference) -> float:
    """Largest difference of the losses and of every parameter from one device's."""
    losses, params = reference
    stages = {r["stage"]: r["params"] for r in run}  # any rank of a stage holds its whole part
    mine = [p for s in sorted(stages) for p in stages[s]]
    assert len(mine) == len(params)
    diffs = [abs(a - b) for r in run for a, b in zip(r["losses"], losses, strict=True)]
    return max(diffs + [(a - b).abs().max().item() for a, b in zip(mine, params, strict=True)])


def test_a_3d_mesh_trains_as_one_device(runs):
    reference, out = runs
    assert [r["3d"]["stage"] for r in out] == [0, 0, 0, 0, 1, 1, 1, 1]  # pp outermost
    assert gap([r["3d"] for r in out], reference) < 1e-10
    assert gap([r["unscaled"] for r in out], reference) > 1e-3  # the negative control


def test_held_and_sent_bytes_match_the_prediction(runs):
    _, out = runs
    predicted = mesh3d.predict_mesh3d(WORK, *LAYOUT)
    for r in out:
        run = r["3d"]
        assert run["held"] == predicted["held"][run["stage"]]
        one_way = {"send": predicted["sent"]} if run["stage"] == 0 else {"recv": predicted["sent"]}
        assert {k: run["bytes"][k] for k in one_way} == one_way  # activations forward
        back = "recv" if run["stage"] == 0 else "send"
        assert run["bytes"][back] == predicted["sent"]  # their gradients back, as large
        assert run["calls"]["send"] == run["calls"]["recv"] == 2  # one each way per micro-batch
    whole = sum(p.numel() * 8 for p in WORK.model().parameters())
    assert mesh3d.predict_mesh3d(WORK, 1, 1, 1, 1) == {"held": [whole], "sent": 0}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((3, 1, 1, 1), "2 transformer blocks do not split into pp=3 stages"),
        ((2, 2, 1, 4), "a batch of 4 does not split into dp=2 parts of m=4 micro-batches"),
        ((2, 0, 1, 1), "dp must be a whole number >= 1, got 0"),
    ],
)
def test_bad_layouts_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        mesh3d.predict_mesh3d(WORK, *args)


def test_a_layout_that_is_not_the_world_is_refused():
    with pytest.raises(ValueError, match=r"pp=2 x dp=2 x tp=1 is 4, but world=8"):
        mesh3d.mesh3d_worker(0, 8, WORK, 2, 2, 1, 2)


def test_stages_split_the_model_in_order():
    net = dataclasses.replace(WORK, num_layers=4).model()
    parts = [mesh3d.stage_units(net, 2, s) for s in range(2)]
    assert [len(p) for p in parts] == [3, 4]  # embedding + 2 blocks; 2 blocks + norm + output
    assert [u for p in parts for u in p] == list(net)
