"""Shared test helpers: the project root, free ports, and small Fashion-MNIST-format IDX files
(random ones from write_idx; FAKE, whose image i has pixel (0, 0) == i, from write_files).

`pythonpath` in pyproject.toml puts the project root and scripts/ on sys.path, so tests import
`d2l_gpu` from this checkout and the scripts (`nbtools`, ...) as modules.
"""

from __future__ import annotations

import gc
import gzip
import hashlib
import multiprocessing.util
import os
import shutil
import struct
import sys
import tempfile
import uuid
import zlib
from pathlib import Path

import numpy as np
import pytest

from d2l_gpu.distributed import free_port  # noqa: F401 - re-exported for the tests

ROOT = Path(__file__).resolve().parent.parent

if os.environ.get("D2L_GPU_BROWSER") != "1":
    # Real-browser tests run only when asked (`make test-browser`): they need Chromium and
    # minutes of CPU, so plain `pytest tests` does not even collect them. One conftest.py only:
    # a second one (tests/browser/conftest.py) took the module name `conftest` from this one.
    collect_ignore = ["browser"]


# --- the oldest PyTorch admitted (2.4; `make test-oldest`): what it lacks is skipped, said why ---

NEEDS_2_6 = ("fsdp", "fsdp-tp", "pipeline")  # --strategy values that refuse PyTorch < 2.6


def _lacks(major: int, minor: int, what: str) -> str | None:
    """The sentence require_torch raises for `what` on this PyTorch, or None if it has it."""
    from d2l_gpu.distributed import NeedsNewerTorch, require_torch

    try:
        require_torch(major, minor, what)
    except NeedsNewerTorch as e:
        return str(e)
    return None


def newer_torch(major: int, minor: int, what: str):
    """A mark that skips a test of `what` on a PyTorch older than major.minor."""
    reason = _lacks(major, minor, what)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def skip_strategies_this_torch_lacks(*strategies: str) -> None:
    """Skip the calling test if one of `strategies` needs a newer PyTorch than this one."""
    lacking = [s for s in strategies if s in NEEDS_2_6]
    reason = lacking and _lacks(2, 6, f"--strategy {', '.join(lacking)}")
    if reason:
        pytest.skip(reason)


# --- nothing left behind: processes, namespaces, mounts, temporary files (tests/leftovers.py) ---


def pytest_configure(config):
    """Stop nbval's kernels as Jupyter's "Shut Down Kernel" does: a request, then a clean exit.

    nbval kills each kernel (`shutdown_kernel(now=True)`), so a lesson's files that Python removes
    at exit (`tempfile.TemporaryDirectory()` in lesson 4) stayed behind in every run, a leak that
    `make test` shows since it runs the notebooks inside the leftover check (issue 39)."""
    try:
        from nbval.kernel import RunningKernel
    except ImportError:  # no nbval: no notebooks in this run
        return

    def stop(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)  # waits a few seconds for the exit, then kills
        del self.km

    RunningKernel.stop = stop


def pytest_sessionstart(session):
    """Give the run its own TMPDIR and mark its processes, then note what exists already.

    Not for the browser tests (`make test-browser`), whose JupyterLab and Chromium keep their own
    helper processes and caches."""
    if os.environ.get("D2L_GPU_BROWSER") == "1" or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # a worker of `pytest -n`: its controller set the mark and TMPDIR it inherits
    import leftovers

    # multiprocessing's own folder (the socket of run_workers' fork server) stays where it would
    # be, and multiprocessing removes it when this process exits, after the run's folder is gone
    multiprocessing.util.get_temp_dir()
    token, tmp = uuid.uuid4().hex, Path(tempfile.mkdtemp(prefix="d2l-tests-"))
    tmp.chmod(0o755)  # as /tmp is to others: a test runs code as a user without privileges
    os.environ[leftovers.MARK], os.environ["TMPDIR"], tempfile.tempdir = token, str(tmp), str(tmp)
    session.config.stash[_LEFTOVERS] = (token, tmp, leftovers.snapshot(token, tmp))


@pytest.hookimpl(hookwrapper=True)
def pytest_sessionfinish(session, exitstatus):
    """Fail the run if it left a process, namespace, mount or temporary entry behind.

    A wrapper, and the check after its yield: under `pytest -n`, the workers (which carry the
    run's mark) are ended by xdist's own sessionfinish, which must have run first."""
    yield
    import leftovers

    if _LEFTOVERS not in session.config.stash:
        return
    token, tmp, before = session.config.stash[_LEFTOVERS]
    # a lesson's cells run by a test (lesson 4's `workdir = tempfile.TemporaryDirectory()`) sit in
    # reference cycles (a function's globals are its namespace): their folders go when the cycle
    # is collected, which without this happened at a random later time (once after this check)
    gc.collect()
    found = leftovers.wait_until_clean(before, token, tmp)
    if found:
        print("\nThe tests left these behind (tests/leftovers.py):", file=sys.stderr)
        for sentence in found:
            print(f"  {sentence}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif session.exitstatus == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # kept after a failure, for its tmp_path folders
    else:
        print(f"\nThis run's temporary files are kept in {tmp}", file=sys.stderr)


_LEFTOVERS = pytest.StashKey[tuple]()


def idx_bytes(array: np.ndarray, kind: str) -> bytes:
    """Encode a uint8 array as an IDX file of `kind` ('images' or 'labels')."""
    magic = 0x803 if kind == "images" else 0x801
    return struct.pack(f">I{array.ndim}I", magic, *array.shape) + array.astype(np.uint8).tobytes()


def write_idx(folder: Path, n_train: int = 256, n_test: int = 64, seed: int = 0) -> Path:
    """Write four small Fashion-MNIST-format IDX files (random images, labels) into `folder`."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        (folder / f"{split}-images-idx3-ubyte").write_bytes(idx_bytes(images, "images"))
        (folder / f"{split}-labels-idx1-ubyte").write_bytes(idx_bytes(labels, "labels"))
    return folder


@pytest.fixture(scope="session")
def root() -> Path:
    """The project's root folder."""
    return ROOT


@pytest.fixture(scope="module")
def small_data(tmp_path_factory) -> Path:
    """A folder with a small random Fashion-MNIST (256 training, 64 test images), per module."""
    return write_idx(tmp_path_factory.mktemp("fashion-mnist"))


# --- the training script's jobs (test_train_ranks, _strategies, _accumulate) ------------------


@pytest.fixture(scope="session")
def job_env(tmp_path_factory) -> dict:
    """The environment of a training job on the small data set (the same files every time)."""
    from train_launch import job_env

    return job_env(write_idx(tmp_path_factory.mktemp("job-data")))


@pytest.fixture(scope="session")
def one_process(job_env, tmp_path_factory) -> dict:
    """Final parameters of the float64 job on one process started without a launcher: what
    every parallel job of the training script is compared with."""
    from train_launch import ARGS64, SCRIPT, load, run

    cwd = tmp_path_factory.mktemp("one-process")
    _, out = run([sys.executable, *SCRIPT, *ARGS64, "--save", "final.pt"], job_env, cwd)
    assert "world size 1 (gloo, cpu, ddp)" in out and "epoch 2/2" in out, out
    return load(cwd / "final.pt")


# --- a tiny Fashion-MNIST whose examples say who they are (tests of the data layer) -------------

N_TRAIN, N_TEST = 50, 20


def fake_fashion(n_train: int = N_TRAIN, n_test: int = N_TEST) -> dict[str, bytes]:
    """IDX content (file name -> bytes) of a tiny Fashion-MNIST; image i has pixel (0, 0) == i."""
    rng = np.random.default_rng(0)
    content = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        images[:, 0, 0] = np.arange(n)
        images[0, 1, :2] = (0, 255)  # make sure both ends of the range occur
        content[f"{prefix}-images-idx3-ubyte"] = idx_bytes(images, "images")
        content[f"{prefix}-labels-idx1-ubyte"] = idx_bytes(np.arange(n) % 10, "labels")
    return content


FAKE = fake_fashion()


def write_files(folder: Path, content: dict = FAKE, gz: bool = True, skip=()) -> Path:
    """Write IDX `content` (gzipped or raw) into `folder`, leaving out the names in `skip`."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in content.items():
        if name not in skip:
            path = folder / (f"{name}.gz" if gz else name)
            path.write_bytes(gzip.compress(body) if gz else body)
    return folder


@pytest.fixture
def data_env(tmp_path, monkeypatch):
    """No data source but the ones a test makes: cache in tmp_path/xdg-cache, full profile, no
    proxies, and FAKE's checksums and sizes vouched for in place of the real set's."""
    from d2l_gpu.data import fashion_mnist as data

    for var in ("D2L_GPU_DATA", "D2L_GPU_MIRROR", "http_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setenv("D2L_GPU_PROFILE", "full")
    monkeypatch.setattr(data, "SYSTEM_DIR", tmp_path / "no-system-dir")
    sums = {name: hashlib.sha256(body).hexdigest() for name, body in FAKE.items()}
    monkeypatch.setattr(data, "SHA256", sums)
    monkeypatch.setattr(data, "EXAMPLES", {"train": N_TRAIN, "test": N_TEST})
    return tmp_path / "xdg-cache" / "d2l_gpu" / "fashion-mnist"


def gzip_bomb(head: bytes, size: int) -> bytes:
    """Gzip data that inflates to `head` then zeros, `size` bytes in all (made in little memory)."""
    z, zeros, left = zlib.compressobj(9, zlib.DEFLATED, 31), bytes(1 << 20), size - len(head)
    parts = [z.compress(head)]
    while left > 0:
        parts.append(z.compress(zeros[: min(left, len(zeros))]))
        left -= len(zeros)
    return b"".join(parts) + z.flush()


def images_header(n: int) -> bytes:
    """The IDX header of `n` Fashion-MNIST images."""
    return struct.pack(">4I", 0x803, n, 28, 28)


@pytest.fixture
def fake_root(tmp_path) -> Path:
    """A folder with FAKE, gzipped: a tiny valid Fashion-MNIST (50 train, 20 test images)."""
    return write_files(tmp_path / "fake")


@pytest.fixture
def lone(small_data, monkeypatch):
    """This process as a lone rank on the small data set."""
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("D2L_GPU_DATA", str(small_data))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture
def group_of_one(monkeypatch):
    """This process as a gloo group of one, through a HashStore (what join_group does alone)."""
    import torch

    from d2l_gpu import distributed

    monkeypatch.delenv("MASTER_ADDR", raising=False)
    distributed.join_group("gloo", torch.device("cpu"))
    yield
    distributed.leave_group()
