"""Data parallelism from scratch (d2l_gpu.parallel): k-device training equals one-device training.

Devices are reused (``[cpu] * k``) so the tests run anywhere; the arithmetic is the same as on k
real GPUs, only the copies between devices become no-ops.  Small random data keeps them fast.

The equivalence over 20 steps is proven in float64: the logic is exact, so k devices match one
device to float64 rounding on every CPU and thread count. In float32 the shards' different
summation order is amplified by training (1e-2 after 20 steps on some CPUs), so the float32
check stays short (2 steps).
"""

import contextlib

import pytest
import torch
from torch.nn import functional as F

import d2l_gpu as d2l
from d2l_gpu.parallel.data_parallel import (
    allreduce,
    evaluate_accuracy_parallel,
    flat_grads,
    get_params,
    reduce_scatter_all_gather,
    split_batch,
    train_batch,
    train_parallel,
)

CPU = torch.device("cpu")
STEPS, LR = 20, 0.2
# float64, 20 steps: measured max difference 5.6e-17 (k = 2, 3, 4; 1 and 2 threads; AMD EPYC);
# the bugs below differ by 0.2-0.3. float32, 2 steps: measured 7.5e-9; the bugs differ by 0.03+.
TOL = {torch.float64: 1e-12, torch.float32: 1e-6}
GAP = 1e-4  # every bug below moves some parameter by far more than this
BATCH_SIZES = (7, 13, 10, 9, 5)  # none divisible by 2, 3 and 4 at once; 5 gives shards of 1-2


@contextlib.contextmanager
def default_dtype(dtype):
    """Create every tensor (parameters, data, gradient buffers) in `dtype` inside the block."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@pytest.fixture
def float64():
    with default_dtype(torch.float64):
        yield


def random_data(n=44, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def minibatches(X, y, steps=STEPS):
    """`steps` minibatches of uneven sizes, the same sequence on every call."""
    start = 0
    for step in range(steps):
        b = BATCH_SIZES[step % len(BATCH_SIZES)]
        if start + b > len(X):
            start = 0
        yield X[start : start + b], y[start : start + b]
        start += b


def run(k, step=train_batch, copy=get_params, flat=False, dtype=torch.float64, steps=STEPS):
    """Train LeNet for `steps` steps on k reused devices; return every replica's parameters."""
    devices = [CPU] * k
    with default_dtype(dtype):
        params = d2l.lenet_params(seed=1)  # the book's N(0, 0.01^2) initialisation
        device_params = [copy(params, d) for d in devices]
        grad_buffers = flat_grads(device_params) if flat else None
        for X, y in minibatches(*random_data(), steps=steps):
            step(X, y, device_params, devices, LR, grad_buffers)
    assert all(p.dtype == dtype for params in device_params for p in params)
    return device_params


def max_difference(device_params, reference):
    """Largest absolute difference between any replica's parameters and the reference."""
    return max(
        (p - r).abs().max().item()
        for params in device_params
        for p, r in zip(params, reference, strict=True)
    )


@pytest.fixture(scope="module")
def single_device():
    (params,) = run(1)
    return params


# --- the equivalence proof ------------------------------------------------------------------


@pytest.mark.parametrize("flat", [False, True], ids=["per-parameter", "flat-buffer"])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_k_devices_equal_one_device(k, flat, single_device):
    device_params = run(k, flat=flat)
    assert max_difference(device_params, single_device) < TOL[torch.float64]


@pytest.mark.parametrize("k", [2, 3, 4])
def test_k_devices_equal_one_device_float32_short(k):
    reference = run(1, dtype=torch.float32, steps=2)[0]
    assert max_difference(run(k, dtype=torch.float32, steps=2), reference) < TOL[torch.float32]
    bug = run(k, step=train_batch_shard_normalised, dtype=torch.float32, steps=2)
    assert max_difference(bug, reference) > GAP  # teeth at 2 steps too


def test_training_moved_the_parameters(single_device):
    # matching the single-device run is not trivial: 20 steps moved it well beyond the tolerance
    with default_dtype(torch.float64):
        start = d2l.lenet_params(seed=1)
    assert max_difference([start], single_device) > GAP


# --- the check has teeth: deliberately buggy variants fail it -------------------------------


def train_batch_shard_normalised(X, y, device_params, devices, lr, grad_buffers=None):
    """BUG: divides each replica's summed gradient by its shard size, not the whole batch."""
    X_shards, y_shards = split_batch(X, y, devices)
    for X_shard, y_shard, W in zip(X_shards, y_shards, device_params, strict=True):
        F.cross_entropy(d2l.lenet(X_shard, W), y_shard, reduction="sum").backward()
    with torch.no_grad():
        for i in range(len(device_params[0])):
            allreduce([params[i].grad for params in device_params])
    for params, X_shard in zip(device_params, X_shards, strict=True):
        d2l.sgd(params, lr, X_shard.shape[0])


def train_batch_without_allreduce(X, y, device_params, devices, lr, grad_buffers=None):
    """BUG: every replica steps with its own shard's gradient; the replicas drift apart."""
    X_shards, y_shards = split_batch(X, y, devices)
    for X_shard, y_shard, W in zip(X_shards, y_shards, device_params, strict=True):
        F.cross_entropy(d2l.lenet(X_shard, W), y_shard, reduction="sum").backward()
    for params in device_params:
        d2l.sgd(params, lr, X.shape[0])


def get_params_shared(params, device):
    """BUG: `.to` on the same device returns the tensor itself, so reused replicas share it."""
    return [p.to(device).requires_grad_() for p in params]


@pytest.mark.parametrize("k", [2, 3, 4])
def test_the_check_catches_shard_size_normalisation(k, single_device):
    assert max_difference(run(k, step=train_batch_shard_normalised), single_device) > GAP


@pytest.mark.parametrize(
    "bug",
    [dict(step=train_batch_without_allreduce), dict(copy=get_params_shared)],
    ids=["no-allreduce", "replicas-share-tensors"],
)
def test_the_check_catches_other_bugs(bug, single_device):
    assert max_difference(run(2, **bug), single_device) > GAP


def test_shard_normalisation_is_invisible_on_one_device(single_device):
    # with k = 1 the shard is the whole batch: why the proof needs k >= 2
    (params,) = run(1, step=train_batch_shard_normalised)
    assert max_difference([params], single_device) < TOL[torch.float64]


# --- building blocks -------------------------------------------------------------------------


def test_get_params_copies_even_on_the_same_device():
    params = d2l.lenet_params(seed=0)
    replica = get_params(params, CPU)
    assert all(r.requires_grad and r.device == CPU for r in replica)
    assert all(torch.equal(r, p) for r, p in zip(replica, params, strict=True))
    assert all(r.data_ptr() != p.data_ptr() for r, p in zip(replica, params, strict=True))
    assert not any(p.requires_grad for p in params)  # the source is left alone


@pytest.mark.parametrize("n", [4, 5, 7, 10])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_split_batch_uneven(n, k):
    X, y = torch.arange(n * 3.0).reshape(n, 3), torch.arange(n)
    X_shards, y_shards = split_batch(X, y, [CPU] * k)
    sizes = [len(s) for s in X_shards]
    assert len(X_shards) == len(y_shards) == k  # torch.chunk(5, 4) would give only 3 shards
    assert sizes == [len(s) for s in y_shards] and sum(sizes) == n
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    assert torch.equal(torch.cat(X_shards), X) and torch.equal(torch.cat(y_shards), y)


def test_split_batch_puts_each_shard_on_its_device():
    devices = [torch.device("meta"), CPU, torch.device("meta")]  # distinct devices, no GPU needed
    X_shards, y_shards = split_batch(torch.rand(5, 2), torch.arange(5), devices)
    assert [s.device for s in X_shards] == devices == [s.device for s in y_shards]


def test_split_batch_too_small_is_a_clear_error():
    with pytest.raises(ValueError, match="3 examples cannot be split across 4 devices"):
        split_batch(torch.rand(3, 2), torch.arange(3), [CPU] * 4)
    with pytest.raises(ValueError, match="X has 4 examples but y has 3"):
        split_batch(torch.rand(4, 2), torch.arange(3), [CPU] * 2)


def random_tensors(k, shape=(5, 7), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(k)]


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_allreduce_sums_and_puts_the_sum_on_each_device(k):
    data = random_tensors(k)
    expected = torch.stack(data).sum(dim=0)
    pointers = [x.data_ptr() for x in data]
    allreduce(data)
    assert all(torch.allclose(x, expected, rtol=0, atol=1e-12) for x in data)
    assert [x.data_ptr() for x in data] == pointers  # in place: .grad tensors stay the same


@pytest.mark.parametrize("shape", [(5, 7), (3,), (2, 1)])  # (2, 1) with k = 4: empty slices
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_reduce_scatter_all_gather_equals_allreduce(k, shape):
    simple, fast = random_tensors(k, shape), random_tensors(k, shape)
    allreduce(simple)
    reduce_scatter_all_gather(fast)
    assert all(torch.allclose(s, f, rtol=0, atol=1e-12) for s, f in zip(simple, fast, strict=True))


def test_flat_grads_are_views_that_backward_fills():
    device_params = [get_params(d2l.lenet_params(seed=0), CPU) for _ in range(2)]
    buffers = flat_grads(device_params)
    assert [b.numel() for b in buffers] == [sum(p.numel() for p in device_params[0])] * 2
    X, y = random_data(8)
    for params in device_params:
        F.cross_entropy(d2l.lenet(X, params), y, reduction="sum").backward()
    for params, flat in zip(device_params, buffers, strict=True):
        assert all(p.grad.untyped_storage().data_ptr() == flat.data_ptr() for p in params)
        assert torch.equal(torch.cat([p.grad.reshape(-1) for p in params]), flat)
    assert buffers[0].abs().sum() > 0


def test_flat_allreduce_equals_per_parameter_allreduce(float64):
    per_param = [get_params(d2l.lenet_params(seed=0), CPU) for _ in range(3)]
    flat = [get_params(d2l.lenet_params(seed=0), CPU) for _ in range(3)]
    buffers = flat_grads(flat)
    X, y = random_data(9)
    for device_params in (per_param, flat):
        for params, X_shard, y_shard in zip(device_params, X.split(3), y.split(3), strict=True):
            F.cross_entropy(d2l.lenet(X_shard, params), y_shard, reduction="sum").backward()
    for i in range(len(per_param[0])):
        allreduce([params[i].grad for params in per_param])
    reduce_scatter_all_gather(buffers)
    for a, b in zip(per_param, flat, strict=True):
        for p, q in zip(a, b, strict=True):
            assert torch.allclose(p.grad, q.grad, rtol=0, atol=1e-12)


class Batches:
    """A re-iterable list of (X, y) minibatches, like a data iterator."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


@pytest.mark.parametrize("k", [1, 3])
def test_parallel_evaluation_equals_single_device(k, float64):
    params = d2l.lenet_params(seed=0, scale=0.1)
    X, y = random_data(50)
    batches = Batches([(X[:20], y[:20]), (X[20:27], y[20:27]), (X[27:], y[27:])])
    expected = (d2l.lenet(X, params).argmax(dim=1) == y).float().mean().item()
    device_params = [get_params(params, CPU) for _ in range(k)]
    assert evaluate_accuracy_parallel(device_params, batches, [CPU] * k) == pytest.approx(expected)


def test_train_parallel_runs_and_reports(capsys, float64):
    X, y = random_data(40)
    train_iter = Batches([(X[:20], y[:20]), (X[20:], y[20:])])
    test_iter = Batches([(X[:15], y[:15]), (X[15:], y[15:])])
    runs = [
        train_parallel([CPU] * k, train_iter, test_iter, LR, 2, flat=flat)
        for k, flat in [(1, False), (3, True)]
    ]
    for accs, seconds in runs:
        assert len(accs) == 2 and all(0 <= a <= 1 for a in accs) and seconds > 0
    assert runs[0][0] == runs[1][0]  # float64: the same steps give the same predictions
    assert capsys.readouterr().out.count("sec/epoch on [cpu") == 2
