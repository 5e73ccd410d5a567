"""Tests of d2l_gpu.data: where the files come from, checksums, permissions, the real set."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import N_TEST, N_TRAIN, ROOT, write_files

from d2l_gpu.data import fashion_mnist as data
from d2l_gpu.data.fashion_mnist import (
    DataError,
    fashion_mnist_dir,
    load_data_fashion_mnist,
    read_fashion_mnist,
)

pytestmark = pytest.mark.usefixtures("data_env")
REAL_DIR = Path("/usr/share/datasets/fashion-mnist")
REAL_SHA256, REAL_EXAMPLES = dict(data.SHA256), dict(data.EXAMPLES)  # before data_env swaps them


# --- checksums and where the files come from -----------------------------------------------------


def test_checksum_checked_for_system_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "SYSTEM_DIR", write_files(tmp_path / "system"))
    assert read_fashion_mnist()["train_images"].shape[0] == N_TRAIN
    monkeypatch.setitem(data.SHA256, "t10k-labels-idx1-ubyte", "0" * 64)
    with pytest.raises(DataError, match="SHA-256") as info:
        read_fashion_mnist()
    assert "t10k-labels-idx1-ubyte" in str(info.value)


def test_checksum_for_own_root_only_on_request(fake_root, monkeypatch):
    monkeypatch.setitem(data.SHA256, "train-images-idx3-ubyte", "0" * 64)
    assert read_fashion_mnist(fake_root)["train_images"].shape[0] == N_TRAIN  # parsed, not hashed
    with pytest.raises(DataError, match="SHA-256"):
        read_fashion_mnist(fake_root, verify=True)


def test_resolution_order(tmp_path, monkeypatch, data_env):
    root, env = write_files(tmp_path / "root"), write_files(tmp_path / "env")
    system, cache = write_files(tmp_path / "system"), write_files(data_env)
    monkeypatch.setenv("D2L_GPU_DATA", str(env))
    monkeypatch.setattr(data, "SYSTEM_DIR", system)
    assert fashion_mnist_dir(root) == root
    assert fashion_mnist_dir() == env
    monkeypatch.delenv("D2L_GPU_DATA")
    assert fashion_mnist_dir() == system
    (system / "t10k-labels-idx1-ubyte.gz").unlink()  # an incomplete folder is not a source
    assert fashion_mnist_dir() == cache
    assert read_fashion_mnist()["test_labels"].shape == (N_TEST,)


def test_root_and_env_must_exist(tmp_path, monkeypatch):
    missing = tmp_path / "nowhere"
    with pytest.raises(DataError, match="does not exist") as info:
        fashion_mnist_dir(missing)
    assert str(missing) in str(info.value) and "dataset-fashion-mnist" in str(info.value)
    monkeypatch.setenv("D2L_GPU_DATA", str(missing))
    with pytest.raises(DataError, match="D2L_GPU_DATA .*does not exist"):
        fashion_mnist_dir()


def test_root_must_hold_all_files(tmp_path):
    root = write_files(tmp_path / "partial", skip={"train-labels-idx1-ubyte"})
    with pytest.raises(DataError, match=r"lacks train-labels-idx1-ubyte\[\.gz\]"):
        fashion_mnist_dir(root)


@pytest.mark.parametrize("root", ["", "  "])
def test_empty_root_refused(fake_root, root, monkeypatch):
    monkeypatch.chdir(fake_root)  # where an empty root used to lead, silently
    with pytest.raises(ValueError, match="root is empty: pass the folder .* or None"):
        fashion_mnist_dir(root)
    with pytest.raises(ValueError, match="root is empty"):
        load_data_fashion_mnist(8, root=root)
    with pytest.raises(TypeError, match="root must be a folder .* got 5"):
        read_fashion_mnist(5)


UNPRIVILEGED = """
import json, sys
import d2l_gpu
from d2l_gpu import ddp
from d2l_gpu.data.fashion_mnist import DataError, read_fashion_mnist
found = {"package": d2l_gpu.__file__}
for root in sys.argv[1:]:
    try:
        read_fashion_mnist(root)
        found[root] = "read"
    except DataError as e:
        found[root] = str(e)
    except Exception as e:
        found[root] = f"{type(e).__name__}: {e}"
found["ddp"] = ddp.main(["--data-dir", sys.argv[1], "--epochs", "1"])
print(json.dumps(found))
"""


def as_user_without_access(top: Path) -> list[str]:
    """The command prefix that runs Python as a user whom permission bits bind (nobody if root)."""
    if os.geteuid() != 0:
        return [sys.executable]
    if shutil.which("setpriv") is None:
        pytest.skip("root ignores permission bits, and setpriv (to become nobody) is absent")
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable]
    if subprocess.run([*prefix, "-c", "import numpy"], cwd=top, capture_output=True).returncode:
        pytest.skip(f"user nobody cannot run {sys.executable} and its packages")
    return prefix


def test_unreadable_file_or_folder_is_a_data_error():
    """As a user without the permission (nobody, when the tests run as root): no traceback."""
    top = Path(tempfile.mkdtemp(prefix="d2l-perm-"))  # pytest's tmp_path is closed to others
    try:
        top.chmod(0o755)
        shutil.copytree(ROOT / "d2l_gpu", top / "pkg" / "d2l_gpu")  # readable, wherever ROOT is
        names = ("file000", "dir600", "dir000", "parent000/inside")
        roots = [write_files(top / name) for name in names]
        (roots[0] / "t10k-labels-idx1-ubyte.gz").chmod(0o000)
        for folder, mode in ((roots[1], 0o600), (roots[2], 0o000), (top / "parent000", 0o000)):
            folder.chmod(mode)
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(top / "pkg"), "HOME": str(top)}
        command = [*as_user_without_access(top), "-c", UNPRIVILEGED, *map(str, roots)]
        done = subprocess.run(command, env=env, cwd=top, capture_output=True, text=True, timeout=99)
    finally:
        for path in (top / "file000" / "t10k-labels-idx1-ubyte.gz", *top.iterdir()):
            path.chmod(0o755)
        shutil.rmtree(top)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["package"].startswith(str(top / "pkg"))
    label = roots[0] / "t10k-labels-idx1-ubyte.gz"
    assert found[str(roots[0])].startswith(f"cannot read {label}: permission denied")
    assert "chmod u+r FILE" in found[str(roots[0])]
    for root, folder in zip(roots[1:], [roots[1], roots[2], top / "parent000"], strict=True):
        assert found[str(root)].startswith(f"cannot look into the folder {folder}: permission")
        assert "chmod u+rx" in found[str(root)]
    assert found["ddp"] == 2 and f"cannot read {label}: permission denied" in done.stderr
    assert "Traceback" not in done.stderr


# --- the real dataset ----------------------------------------------------------------------------

real = pytest.mark.skipif(not REAL_DIR.is_dir(), reason=f"{REAL_DIR} absent")


@pytest.fixture
def real_sums(monkeypatch):
    """The real set's checksums and sizes, vouched for again."""
    monkeypatch.setattr(data, "SHA256", REAL_SHA256)
    monkeypatch.setattr(data, "EXAMPLES", REAL_EXAMPLES)


@pytest.mark.dataset
@real
def test_real_dataset_sizes_and_checksums(real_sums):
    raw = read_fashion_mnist(REAL_DIR, verify=True)
    assert raw["train_images"].shape == (60000, 28, 28) and raw["test_images"].shape[0] == 10000
    assert raw["train_labels"].bincount().tolist() == [6000] * 10


@pytest.mark.dataset
@real
def test_real_dataset_from_system_dir(real_sums, monkeypatch, capsys):
    monkeypatch.setattr(data, "SYSTEM_DIR", REAL_DIR)
    assert fashion_mnist_dir() == REAL_DIR
    train_iter, test_iter = load_data_fashion_mnist(256)
    assert (len(train_iter.y), len(test_iter.y), len(train_iter)) == (60000, 10000, 235)
    monkeypatch.setenv("D2L_GPU_PROFILE", "quick")
    train_iter, test_iter = load_data_fashion_mnist(256)
    assert (len(train_iter.y), len(test_iter.y)) == (data.QUICK_TRAIN_LIMIT, data.QUICK_TEST_LIMIT)
    assert "10000 of 60000" in capsys.readouterr().out
