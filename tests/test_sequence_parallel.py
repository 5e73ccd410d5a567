"""Tensor and sequence parallelism of the small transformer (d2l.transformer), by hand and with
DTensor's parallelize_module, each proven equal to one device in float64 (losses, and parameters
after 3 SGD steps, to 1e-10) on 2 and 4 gloo ranks; the collectives one step calls (TP:
all-reduce; SP: all-gather and reduce-scatter); SP's measured activation peak below TP's, by
about the predicted saving; two negative controls (qkv split contiguously: the wrong heads; SP
without the norms' gradient all-reduce); and the sentences for bad input."""

from unittest import mock

import pytest
import torch

from d2l_gpu.gpt import TransformerBlock
from d2l_gpu.parallel import sequence_parallel as sp
from d2l_gpu.parallel import transformer_parallel as tp
from d2l_gpu.parallel import workload
from d2l_gpu.workers import run_workers

WORK = workload.TransformerWorkload(seq_len=16, steps=3)  # vocab 32, d_model 16, 4 heads, 2 layers
LAYERS = WORK.num_layers
BSH_BYTES = WORK.batch_size * WORK.seq_len * WORK.d_model * 8  # one [B, T, D] float64 tensor


def contiguous_block(block, rank, world):
    """The bug of the first negative control: qkv's columns split contiguously (wrong heads)."""
    return tp.HeadParallelBlock(block, world, rank, tp.tp_column, tp.tp_row, regroup=False)


MISTAKES = {  # the bug, as (name in sequence_parallel, its replacement, the mode it breaks)
    "split qkv contiguously": ("tensor_parallel_block", contiguous_block, "tp"),
    "skip norm sync": ("all_reduce_norm_grads", lambda net: None, "sp"),
}


def two_ranks(rank, world):
    """The four modes and the two broken runs, in one process group."""
    out = {mode: sp.transformer_parallel_worker(rank, world, WORK, mode) for mode in sp.MODES}
    for mistake, (name, bug, mode) in MISTAKES.items():
        with mock.patch.object(sp, name, bug):  # in this rank's process only
            out[mistake] = sp.transformer_parallel_worker(rank, world, WORK, mode)
    return out


def four_ranks(rank, world):
    return {mode: sp.transformer_parallel_worker(rank, world, WORK, mode) for mode in sp.MODES}


@pytest.fixture(scope="module")
def reference():
    """One device, the whole batch, plain SGD: losses and parameters after WORK.steps steps."""
    net = WORK.model()
    X, y = WORK.data()
    losses = workload.train_transformer(net, X, y, WORK.steps, WORK.lr)
    return losses, [p.detach().clone() for p in net.parameters()]


@pytest.fixture(scope="module")
def runs():
    return {
        2: run_workers(two_ranks, 2, backend="gloo", timeout=240),
        4: run_workers(four_ranks, 4, backend="gloo", timeout=240),
    }


def max_diff(xs, ys) -> float:
    return max((a - b).abs().max().item() for a, b in zip(xs, ys, strict=True))


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("mode", sp.MODES)
def test_every_mode_equals_one_device(runs, reference, world, mode):
    losses, params = reference
    for r in runs[world]:
        assert max(abs(a - b) for a, b in zip(r[mode]["losses"], losses, strict=True)) < 1e-10
        assert max_diff(r[mode]["params"], params) < 1e-10


@pytest.mark.parametrize("mistake", ["split qkv contiguously", "skip norm sync"])
def test_negative_controls_differ(runs, reference, mistake):
    _, params = reference
    assert max_diff(runs[2][0][mistake]["params"], params) > 1e-3


@pytest.mark.parametrize("world", [2, 4])
def test_collectives_of_one_step(runs, world):
    """Per block, TP: one all-reduce per sub-layer forward (g) and backward (f): 4. SP: the
    all-gather before qkv and fc1 and the reduce-scatter after proj and fc2, swapped in
    backward (2 + 2 each), plus 2 all-gathers that rebuild qkv's and fc1's inputs in backward
    (only their slices are kept); one all-gather at each end of the sequence-parallel region
    (its backward too) and one coalesced all-reduce of the norms' and row biases' gradients."""
    r = runs[world][0]
    assert r["tp"]["calls"] == {"all_reduce": 4 * LAYERS}
    assert r["sp"]["calls"] == {
        "all_gather": 6 * LAYERS + 2,
        "reduce_scatter": 4 * LAYERS,
        "all_reduce": 1,
    }
    # the same [B, T, D] tensors cross the ranks (an all-reduce is a reduce-scatter and an
    # all-gather), plus the two gathers again in backward
    assert r["tp"]["bytes"]["all_reduce"] == 4 * LAYERS * BSH_BYTES
    assert r["sp"]["bytes"]["reduce_scatter"] == 4 * LAYERS * BSH_BYTES
    assert r["sp"]["bytes"]["all_gather"] == (6 * LAYERS + 2) * BSH_BYTES
    assert set(r["torch_tp"]["calls"]) == {"all_reduce"}
    assert {"all_gather", "reduce_scatter"} <= set(r["torch_sp"]["calls"])


@pytest.mark.parametrize("world", [2, 4])
def test_sequence_parallel_keeps_fewer_activations(runs, world):
    for rank, r in enumerate(runs[world]):
        print(
            f"world {world} rank {rank}: peak of forward+backward measured TP {r['tp']['peak']} "
            f"SP {r['sp']['peak']} bytes; activations predicted TP {r['tp']['predicted']} "
            f"SP {r['sp']['predicted']}"
        )
        assert r["sp"]["predicted"] < r["tp"]["predicted"]
        assert r["sp"]["peak"] < r["tp"]["peak"]
        # The measured saving is near the predicted one (the rest of the peak is the same):
        # 1.06 times it here. The profiler can still overstate SP's smallest peak by up to
        # 6 KiB (seen in 4 of 36 runs of 2 ranks), a third of the saving: hence a wide band.
        saved, predicted = (
            r["tp"]["peak"] - r["sp"]["peak"],
            r["tp"]["predicted"] - r["sp"]["predicted"],
        )
        assert 0.25 * predicted < saved < 2 * predicted
    assert sp.activation_bytes_per_rank(WORK, world, "tp") == 2 * (4 + 13 / world) * BSH_BYTES
    assert sp.activation_bytes_per_rank(WORK, world, "sp") == 2 * 17 / world * BSH_BYTES


def test_each_rank_holds_its_heads_q_k_and_v():
    """One process: rank r's qkv rows are the q, k and v rows of heads r*H/world onwards; the
    whole block (world 1) computes what the fused TransformerBlock does."""
    torch.manual_seed(0)
    block = TransformerBlock(16, 4).double()
    X = torch.randn(2, 8, 16, dtype=torch.float64)
    assert (tp.HeadParallelBlock(block, 1)(X) - block(X)).abs().max() < 1e-12
    W, D = block.qkv.weight, 16
    for world in (1, 2, 4):
        assert torch.equal(tp.ungroup_qkv(tp.group_qkv(W, world), world), W)
        for rank in range(world):
            part = tp.HeadParallelBlock(block, world, rank, tp.tp_column, tp.tp_row)
            rows = slice(rank * D // world, (rank + 1) * D // world)
            for mine, full in zip(part.qkv.weight.chunk(3), W.split(D), strict=True):
                assert torch.equal(mine, full[rows])


def test_bad_input():
    block = TransformerBlock(16, 4)
    with pytest.raises(
        ValueError, match="num_heads=4 and ffn=64 must both be multiples of world=3"
    ):
        tp.tensor_parallel_block(block, 0, 3)
    with pytest.raises(ValueError, match="num_heads=4 .* world=3"):
        sp.sequence_parallel_block(block, 0, 3)
    with pytest.raises(TypeError, match="block must be a d2l.TransformerBlock"):
        tp.tensor_parallel_block(torch.nn.Linear(2, 2), 0, 2)
    with pytest.raises(ValueError, match="num_heads=4 and ffn=64 must be multiples of world=3"):
        sp.transformer_parallel_worker(0, 3, WORK, "tp")
    odd = workload.TransformerWorkload(seq_len=7)
    with pytest.raises(ValueError, match="seq_len=7 is not a multiple of world=2"):
        sp.transformer_parallel_worker(0, 2, odd, "sp")
    with pytest.raises(ValueError, match="mode must be one of"):
        sp.transformer_parallel_worker(0, 2, WORK, "pp")
    with pytest.raises(TypeError, match="work must be a TransformerWorkload"):
        sp.transformer_parallel_worker(0, 2, {"seq_len": 8}, "tp")
    with pytest.raises(ValueError, match="d_model=10 is not a multiple of num_heads=4"):
        workload.TransformerWorkload(d_model=10)
    with pytest.raises(TypeError, match="starts with Linear"):
        tp.parallelize_transformer(torch.nn.Sequential(torch.nn.Linear(2, 2)), None, False)
    with pytest.raises(TypeError, match="mesh must be a 1-D DeviceMesh"):
        tp.parallelize_transformer(WORK.model(), "cpu", sequence_parallel=True)
    with pytest.raises(ValueError, match="seq_len=7 is not a multiple"):
        sp.activation_bytes_per_rank(odd, 2, "sp")
