"""Tests of d2l_gpu.data and d2l_gpu.download on small IDX files the tests write themselves."""

import gzip
import hashlib
import http.server
import socket
import struct
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from d2l_gpu import data
from d2l_gpu.data import (
    DataError,
    fashion_mnist_dir,
    get_fashion_mnist_labels,
    load_data_fashion_mnist,
    parse_idx,
    read_fashion_mnist,
)
from d2l_gpu.download import download

N_TRAIN, N_TEST = 50, 20
REAL_DIR = Path("/usr/share/datasets/fashion-mnist")
REAL_SHA256 = dict(data.SHA256)  # saved before the autouse fixture swaps in the fake set's


def idx_bytes(array, kind):
    """Encode a uint8 array as an IDX file of `kind` ('images' or 'labels')."""
    magic = 0x803 if kind == "images" else 0x801
    return struct.pack(f">I{array.ndim}I", magic, *array.shape) + array.astype(np.uint8).tobytes()


def fake_content(n_train=N_TRAIN, n_test=N_TEST):
    """Decompressed IDX content of a tiny Fashion-MNIST; image i has pixel (0, 0) == i."""
    rng = np.random.default_rng(0)
    content = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        images[:, 0, 0] = np.arange(n)
        images[0, 1, :2] = (0, 255)  # make sure both ends of the range occur
        content[f"{prefix}-images-idx3-ubyte"] = idx_bytes(images, "images")
        content[f"{prefix}-labels-idx1-ubyte"] = idx_bytes(np.arange(n) % 10, "labels")
    return content


CONTENT = fake_content()
FAKE_SHA256 = {name: hashlib.sha256(body).hexdigest() for name, body in CONTENT.items()}


def write_set(folder, content=CONTENT, gz=True, skip=()):
    """Write the four files (gzipped or raw IDX) into `folder`, leaving out the names in `skip`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in content.items():
        if name not in skip:
            path = folder / (f"{name}.gz" if gz else name)
            path.write_bytes(gzip.compress(body) if gz else body)
    return folder


@pytest.fixture(autouse=True)
def clean_env(tmp_path, monkeypatch):
    """No data source but the ones a test makes; caches in tmp_path; full profile; no proxies."""
    for var in ("D2L_GPU_DATA", "D2L_GPU_MIRROR", "http_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setenv("D2L_GPU_PROFILE", "full")
    monkeypatch.setattr(data, "SYSTEM_DIR", tmp_path / "no-system-dir")
    monkeypatch.setattr(data, "SHA256", dict(FAKE_SHA256))


@pytest.fixture
def fake_root(tmp_path):
    """A folder with a tiny, valid Fashion-MNIST (50 train, 20 test images)."""
    return write_set(tmp_path / "fake")


def cache_folder(tmp_path):
    return tmp_path / "xdg-cache" / "d2l_gpu" / "fashion-mnist"


def ids(X):
    """Recover the example numbers stored in pixel (0, 0) of a batch."""
    return (X[:, 0, 0, 0] * 255).round().long().tolist()


# --- IDX parsing ---------------------------------------------------------------------------------


def test_parse_idx_round_trip():
    images = parse_idx(CONTENT["train-images-idx3-ubyte"], "images")
    labels = parse_idx(CONTENT["train-labels-idx1-ubyte"], "labels")
    assert images.shape == (N_TRAIN, 28, 28) and images.dtype == np.uint8
    assert labels.tolist() == [i % 10 for i in range(N_TRAIN)]


IMAGES = CONTENT["t10k-images-idx3-ubyte"]
LABELS = CONTENT["t10k-labels-idx1-ubyte"]


@pytest.mark.parametrize(
    "body, kind, message",
    [
        (IMAGES[:10], "images", "truncated IDX header"),
        (IMAGES[:-1], "images", "truncated"),
        (IMAGES + b"\0", "images", "extra bytes"),
        (LABELS, "images", "magic 0x00000801"),
        (IMAGES, "labels", "magic 0x00000803"),
        (idx_bytes(np.zeros((3, 27, 28)), "images"), "images", "wrong dimensions"),
        (idx_bytes(np.zeros((0, 28, 28)), "images"), "images", "wrong dimensions"),
        (idx_bytes(np.array([1, 2, 10, 3]), "labels"), "labels", "label 10 at index 2"),
    ],
    ids=["short-header", "truncated", "extra", "magic-i", "magic-l", "dims", "empty", "label"],
)
def test_parse_idx_rejects_bad_files(body, kind, message):
    with pytest.raises(DataError, match=message) as info:
        parse_idx(body, kind, "some/file")
    assert "some/file" in str(info.value) and "good copy" in str(info.value)


def test_count_mismatch(tmp_path):
    content = dict(CONTENT, **{"train-labels-idx1-ubyte": idx_bytes(np.zeros(49), "labels")})
    with pytest.raises(DataError, match="50 train images but 49 train labels"):
        read_fashion_mnist(write_set(tmp_path / "bad", content))


def test_corrupt_gzip_names_file(tmp_path):
    root = write_set(tmp_path / "bad")
    path = root / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError, match="not a valid gzip file") as info:
        read_fashion_mnist(root)
    assert str(path) in str(info.value)


def test_raw_idx_files_accepted(tmp_path):
    raw = read_fashion_mnist(write_set(tmp_path / "raw", gz=False))
    assert raw["train_images"].shape == (N_TRAIN, 28, 28)
    assert raw["test_labels"].dtype == torch.uint8 and raw["test_labels"].shape == (N_TEST,)


def test_read_is_cached_in_process_but_sees_changed_files(fake_root):
    first = read_fashion_mnist(fake_root)
    assert read_fashion_mnist(fake_root) is first
    write_set(fake_root, fake_content(n_train=40))
    assert read_fashion_mnist(fake_root)["train_images"].shape[0] == 40


# --- checksums and where the files come from -----------------------------------------------------


def test_checksum_checked_for_system_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "SYSTEM_DIR", write_set(tmp_path / "system"))
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


def test_resolution_order(tmp_path, monkeypatch):
    root, env = write_set(tmp_path / "root"), write_set(tmp_path / "env")
    system, cache = write_set(tmp_path / "system"), write_set(cache_folder(tmp_path))
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
    root = write_set(tmp_path / "partial", skip={"train-labels-idx1-ubyte"})
    with pytest.raises(DataError, match=r"lacks train-labels-idx1-ubyte\[\.gz\]"):
        fashion_mnist_dir(root)


# --- the iterators -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -3, 2.5, "8", True, None])
def test_batch_size_must_be_positive_int(fake_root, bad):
    with pytest.raises(ValueError, match=f"batch_size must be a positive integer, got {bad!r}"):
        load_data_fashion_mnist(bad, root=fake_root)


@pytest.mark.parametrize("kw", [{"limit": 0}, {"resize": 0}, {"resize": (8, -1)}, {"seed": -1}])
def test_other_arguments_checked(fake_root, kw):
    with pytest.raises(ValueError):
        load_data_fashion_mnist(8, root=fake_root, **kw)


def test_batches_shapes_dtypes_scaling(fake_root):
    train_iter, test_iter = load_data_fashion_mnist(16, root=fake_root)
    assert (len(train_iter), len(test_iter)) == (4, 2)  # last partial batch kept
    assert train_iter.batch_size == 16 and train_iter.device == torch.device("cpu")
    assert train_iter.X.dtype == torch.uint8 and train_iter.X.shape == (N_TRAIN, 28, 28)
    assert train_iter.y.dtype == torch.int64
    batches = list(test_iter)
    assert [len(y) for _, y in batches] == [16, 4]
    X, y = batches[0]
    assert X.shape == (16, 1, 28, 28) and X.dtype == torch.float32 and y.dtype == torch.int64
    assert X.min() == 0 and X.max() == 1
    raw = read_fashion_mnist(fake_root)
    assert torch.equal(X[:, 0], raw["test_images"][:16].float() / 255)
    assert torch.equal(y, raw["test_labels"][:16].long())


def test_test_order_fixed(fake_root):
    _, test_iter = load_data_fashion_mnist(8, root=fake_root)
    first, second = [sum((ids(X) for X, _ in test_iter), []) for _ in range(2)]
    assert first == second == list(range(N_TEST))


def epochs(train_iter, n=3):
    """The example order of `n` successive epochs."""
    return [sum((ids(X) for X, _ in train_iter), []) for _ in range(n)]


def test_shuffle_per_epoch_reproducible(fake_root):
    train_iter, _ = load_data_fashion_mnist(8, root=fake_root, seed=1)
    orders = epochs(train_iter)
    for order in orders:
        assert sorted(order) == list(range(N_TRAIN))  # every example exactly once
    assert orders[0] != orders[1] != orders[2] and orders[0] != list(range(N_TRAIN))
    assert epochs(load_data_fashion_mnist(8, root=fake_root, seed=1)[0]) == orders
    assert epochs(load_data_fashion_mnist(8, root=fake_root, seed=2)[0]) != orders
    # each iter() is a new epoch, even before any batch is taken
    train_iter, _ = load_data_fashion_mnist(8, root=fake_root, seed=1)
    a, b = iter(train_iter), iter(train_iter)
    assert ids(next(b)[0]) == orders[1][:8] and ids(next(a)[0]) == orders[0][:8]


def test_labels_follow_images_when_shuffled(fake_root):
    train_iter, _ = load_data_fashion_mnist(8, root=fake_root, seed=3)
    for X, y in train_iter:
        assert [i % 10 for i in ids(X)] == y.tolist()


def test_seed_none_follows_torch_manual_seed(fake_root):
    torch.manual_seed(0)
    a = epochs(load_data_fashion_mnist(8, root=fake_root)[0], 1)
    torch.manual_seed(0)
    assert epochs(load_data_fashion_mnist(8, root=fake_root)[0], 1) == a


@pytest.mark.parametrize("resize, shape", [(32, (32, 32)), ((20, 36), (20, 36)), (14, (14, 14))])
def test_resize(fake_root, resize, shape):
    train_iter, test_iter = load_data_fashion_mnist(8, resize, root=fake_root)
    for it in (train_iter, test_iter):
        X, _ = next(iter(it))
        assert X.shape == (8, 1, *shape) and X.dtype == torch.float32
        assert 0 <= X.min() and X.max() <= 1


def test_limit(fake_root):
    train_iter, test_iter = load_data_fashion_mnist(8, root=fake_root, limit=30)
    assert train_iter.X.shape[0] == 30 and len(train_iter) == 4
    assert test_iter.X.shape[0] == N_TEST  # a limit above the set's size keeps it all
    assert sorted(epochs(train_iter, 1)[0]) == list(range(30))  # the first 30 examples


def test_quick_profile_caps_and_says_so(fake_root, monkeypatch, capsys):
    monkeypatch.setattr(data, "QUICK_TRAIN_LIMIT", 30)
    monkeypatch.setattr(data, "QUICK_TEST_LIMIT", 10)
    monkeypatch.setenv("D2L_GPU_PROFILE", "quick")
    train_iter, test_iter = load_data_fashion_mnist(8, root=fake_root)
    assert (len(train_iter.y), len(test_iter.y)) == (30, 10)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "30 of 50" in out and "D2L_GPU_PROFILE=full" in out
    train_iter, _ = load_data_fashion_mnist(8, root=fake_root, limit=45)  # limit= wins
    assert len(train_iter.y) == 45 and capsys.readouterr().out == ""
    monkeypatch.setenv("D2L_GPU_PROFILE", "full")
    train_iter, _ = load_data_fashion_mnist(8, root=fake_root)
    assert len(train_iter.y) == N_TRAIN and capsys.readouterr().out == ""


@pytest.mark.parametrize("device", [torch.device("cpu"), "cpu"])
def test_device(fake_root, device):
    train_iter, test_iter = load_data_fashion_mnist(8, root=fake_root, device=device)
    assert train_iter.device == test_iter.device == torch.device("cpu")
    X, y = next(iter(train_iter))
    assert X.device == y.device == torch.device("cpu")


def test_text_labels():
    assert get_fashion_mnist_labels([0, 9]) == ["t-shirt", "ankle boot"]
    assert get_fashion_mnist_labels(torch.tensor([1, 8])) == ["trouser", "bag"]


# --- downloads from a real HTTP server on 127.0.0.1 ----------------------------------------------


class Mirror:
    """A local HTTP server: serves `files` (name -> bytes); `lie_length` adds to Content-Length."""

    def __init__(self):
        self.files, self.requests, self.lie_length = {}, [], 0
        mirror = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                name = self.path.lstrip("/")
                mirror.requests.append(name)
                if name not in mirror.files:
                    self.send_error(404)
                    return
                body = mirror.files[name]
                self.send_response(200)
                self.send_header("Content-Length", str(len(body) + mirror.lie_length))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def mirror(monkeypatch):
    """A local mirror serving the tiny set, gzipped; D2L_GPU_MIRROR points at it."""
    server = Mirror()
    server.files = {f"{name}.gz": gzip.compress(body) for name, body in CONTENT.items()}
    monkeypatch.setenv("D2L_GPU_MIRROR", server.url)
    yield server
    server.close()


def leftovers(folder):
    return sorted(p.name for p in Path(folder).glob(".*part"))


def test_download_success(mirror, tmp_path, capsys):
    raw = read_fashion_mnist()
    cache = cache_folder(tmp_path)
    assert sorted(p.name for p in cache.iterdir()) == sorted(f"{n}.gz" for n in CONTENT)
    assert raw["train_images"].shape == (N_TRAIN, 28, 28)
    assert "100%" in capsys.readouterr().err  # progress bar
    mirror.requests.clear()
    assert fashion_mnist_dir() == cache and mirror.requests == []  # the cache is used now


def test_download_fetches_only_missing_files(mirror, tmp_path):
    write_set(cache_folder(tmp_path), skip={"t10k-images-idx3-ubyte"})
    assert fashion_mnist_dir() == cache_folder(tmp_path)
    assert mirror.requests == ["t10k-images-idx3-ubyte.gz"]


def test_download_checksum_mismatch_leaves_nothing(mirror, tmp_path):
    mirror.files["t10k-labels-idx1-ubyte.gz"] = gzip.compress(idx_bytes(np.zeros(N_TEST), "labels"))
    with pytest.raises(DataError, match="SHA-256") as info:
        read_fashion_mnist()
    assert mirror.url + "t10k-labels-idx1-ubyte.gz" in str(info.value)
    cache = cache_folder(tmp_path)
    assert not list(cache.glob("t10k-labels*")) and leftovers(cache) == []


def test_download_truncated_body_leaves_nothing(mirror, tmp_path):
    mirror.lie_length = 1000
    with pytest.raises(DataError, match="is truncated: got"):
        read_fashion_mnist()
    assert list(cache_folder(tmp_path).iterdir()) == []


def test_download_not_found(mirror, tmp_path):
    del mirror.files["train-labels-idx1-ubyte.gz"]
    with pytest.raises(DataError, match="404"):
        read_fashion_mnist()
    assert leftovers(cache_folder(tmp_path)) == []


def test_unreachable_mirror_says_how_to_get_files(monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/"
    monkeypatch.setenv("D2L_GPU_MIRROR", url)
    with pytest.raises(DataError) as info:
        load_data_fashion_mnist(8)
    message = str(info.value)
    assert url + "train-images-idx3-ubyte.gz" in message
    assert "dataset-fashion-mnist" in message and "D2L_GPU_DATA" in message


def test_failed_download_keeps_good_copies(mirror, tmp_path):
    cache = write_set(cache_folder(tmp_path), skip={"t10k-images-idx3-ubyte"})
    before = {p.name: p.read_bytes() for p in cache.iterdir()}
    mirror.files["t10k-images-idx3-ubyte.gz"] = b"not gzip at all"
    with pytest.raises(DataError):
        read_fashion_mnist()
    assert {p.name: p.read_bytes() for p in cache.iterdir()} == before
    # the low-level download never replaces a good file with a bad one either
    good = cache / "train-images-idx3-ubyte.gz"
    mirror.files["train-images-idx3-ubyte.gz"] = gzip.compress(b"other")
    with pytest.raises(DataError, match="SHA-256"):
        download(mirror.url + "train-images-idx3-ubyte.gz", good, FAKE_SHA256[good.name[:-3]])
    assert good.read_bytes() == before[good.name] and leftovers(cache) == []


# --- the real dataset ----------------------------------------------------------------------------

real = pytest.mark.skipif(not REAL_DIR.is_dir(), reason=f"{REAL_DIR} absent")


@pytest.mark.dataset
@real
def test_real_dataset_sizes_and_checksums(monkeypatch):
    monkeypatch.setattr(data, "SHA256", REAL_SHA256)
    raw = read_fashion_mnist(REAL_DIR, verify=True)
    assert raw["train_images"].shape == (60000, 28, 28) and raw["test_images"].shape[0] == 10000
    assert raw["train_labels"].bincount().tolist() == [6000] * 10


@pytest.mark.dataset
@real
def test_real_dataset_from_system_dir(monkeypatch, capsys):
    monkeypatch.setattr(data, "SYSTEM_DIR", REAL_DIR)
    monkeypatch.setattr(data, "SHA256", REAL_SHA256)
    assert fashion_mnist_dir() == REAL_DIR
    train_iter, test_iter = load_data_fashion_mnist(256)
    assert (len(train_iter.y), len(test_iter.y), len(train_iter)) == (60000, 10000, 235)
    monkeypatch.setenv("D2L_GPU_PROFILE", "quick")
    train_iter, test_iter = load_data_fashion_mnist(256)
    assert (len(train_iter.y), len(test_iter.y)) == (data.QUICK_TRAIN_LIMIT, data.QUICK_TEST_LIMIT)
    assert "10000 of 60000" in capsys.readouterr().out
