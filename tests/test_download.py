"""Tests of d2l_gpu.download and of the data layer's downloads, from an HTTP server on 127.0.0.1."""

import gzip
import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import tracemalloc

import numpy as np
import pytest
from conftest import FAKE, N_TEST, N_TRAIN, ROOT, gzip_bomb, idx_bytes, images_header, write_files

from d2l_gpu.data import download as dl
from d2l_gpu.data import fashion_mnist as data
from d2l_gpu.data.fashion_mnist import (
    DataError,
    fashion_mnist_dir,
    load_data_fashion_mnist,
    read_fashion_mnist,
)

pytestmark = pytest.mark.usefixtures("data_env")


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins every handler: nothing outlives a test


class Mirror:
    """A local HTTP server of `files` (name -> bytes), with the faults a test switches on.

    lie_length: added to Content-Length; no_length: no Content-Length at all; slow: names whose
    body trickles at 20 bytes/s; slow_headers: names whose status line trickles at 5 bytes/s.
    """

    def __init__(self):
        self.files, self.requests, self.lie_length, self.no_length = {}, [], 0, False
        self.slow, self.slow_headers, self.stop = set(), set(), threading.Event()
        mirror = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                name = self.path.lstrip("/")
                mirror.requests.append(name)
                try:
                    mirror.answer(self, name)
                except OSError:  # the client gave up
                    pass

            def log_message(self, *args):
                pass

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,))
        self.thread.start()

    def trickle(self, out, body: bytes, pause: float) -> None:
        for i in range(len(body)):
            if self.stop.wait(pause):
                return
            out.write(body[i : i + 1])

    def answer(self, handler, name: str) -> None:
        if name in self.slow_headers:
            return self.trickle(handler.wfile, b"HTTP/1.0 200 OK\r\n\r\n", 0.2)
        if name not in self.files:
            return handler.send_error(404)
        body = self.files[name]
        handler.send_response(200)
        if not self.no_length:
            handler.send_header("Content-Length", str(len(body) + self.lie_length))
        handler.end_headers()
        if name in self.slow:
            return self.trickle(handler.wfile, body, 0.05)
        handler.wfile.write(body)

    def close(self):
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def mirror(monkeypatch):
    """A local mirror serving the tiny set, gzipped; D2L_GPU_MIRROR points at it."""
    server = Mirror()
    server.files = {f"{name}.gz": gzip.compress(body) for name, body in FAKE.items()}
    monkeypatch.setenv("D2L_GPU_MIRROR", server.url)
    yield server
    server.close()


def leftovers(folder):
    return sorted(p.name for p in folder.glob(".*part")) if folder.is_dir() else []


def names(folder):
    return sorted(p.name for p in folder.iterdir())


GZ_NAMES = sorted(f"{name}.gz" for name in FAKE)


# --- what already holds --------------------------------------------------------------------------


def test_download_success_quiet_off_a_terminal(mirror, data_env, capsys):
    raw = read_fashion_mnist()
    assert names(data_env) == GZ_NAMES and raw["train_images"].shape == (N_TRAIN, 28, 28)
    err = capsys.readouterr().err
    assert "Downloading Fashion-MNIST from" in err and "%" not in err  # no bar: not a terminal
    mirror.requests.clear()
    assert fashion_mnist_dir() == data_env and mirror.requests == []  # the cache is used now


def test_progress_bar_when_asked(mirror, tmp_path, capsys):
    dl.download(mirror.url + "train-images-idx3-ubyte.gz", tmp_path / "x.gz", progress=True)
    err = capsys.readouterr().err
    assert "x.gz: 100%" in err and "B/s" in err  # tqdm's bar, with the size and the rate


def test_download_fetches_only_missing_files(mirror, data_env):
    write_files(data_env, skip={"t10k-images-idx3-ubyte"})
    assert fashion_mnist_dir() == data_env
    assert mirror.requests == ["t10k-images-idx3-ubyte.gz"]


def test_download_checksum_mismatch_leaves_nothing(mirror, data_env):
    mirror.files["t10k-labels-idx1-ubyte.gz"] = gzip.compress(idx_bytes(np.zeros(N_TEST), "labels"))
    with pytest.raises(DataError, match="SHA-256") as info:
        read_fashion_mnist()
    assert mirror.url + "t10k-labels-idx1-ubyte.gz" in str(info.value)
    assert not list(data_env.glob("t10k-labels*")) and leftovers(data_env) == []


def test_download_truncated_body_leaves_nothing(mirror, data_env):
    mirror.lie_length = 1000
    with pytest.raises(DataError, match="is truncated: got .* Nothing was saved; try again"):
        read_fashion_mnist()
    assert list(data_env.iterdir()) == []


def test_download_not_found(mirror, data_env):
    del mirror.files["train-labels-idx1-ubyte.gz"]
    with pytest.raises(DataError, match="404"):
        read_fashion_mnist()
    assert leftovers(data_env) == []


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


def test_failed_download_keeps_good_copies(mirror, data_env):
    cache = write_files(data_env, skip={"t10k-images-idx3-ubyte"})
    before = {p.name: p.read_bytes() for p in cache.iterdir()}
    mirror.files["t10k-images-idx3-ubyte.gz"] = b"not gzip at all"
    with pytest.raises(DataError):
        read_fashion_mnist()
    assert {p.name: p.read_bytes() for p in cache.iterdir()} == before
    # the low-level download never replaces a good file with a bad one either
    good = cache / "train-images-idx3-ubyte.gz"
    mirror.files["train-images-idx3-ubyte.gz"] = gzip.compress(b"other")

    def verify(path):
        data.read_idx(path, "images")

    with pytest.raises(DataError, match="truncated IDX header"):
        dl.download(mirror.url + "train-images-idx3-ubyte.gz", good, verify)
    assert good.read_bytes() == before[good.name] and leftovers(cache) == []


# --- a truncated download without a length header (issue 12, item 8) ---------------------------


def test_truncated_download_without_length_names_the_url(mirror, data_env):
    mirror.no_length = True
    name = "train-images-idx3-ubyte.gz"
    mirror.files[name] = mirror.files[name][:-100]
    with pytest.raises(DataError) as info:
        read_fashion_mnist()
    message = str(info.value)
    assert f"{mirror.url}{name}: the gzip data ends early" in message
    assert "Nothing was saved; try again" in message and ".part" not in message
    assert "delete it" not in message.split("To get the files")[0]
    assert leftovers(data_env) == [] and not (data_env / name).exists()


# --- slow mirrors: a deadline and a minimum rate (item 5) ----------------------------------------


@pytest.mark.parametrize("fault", ["slow", "slow_headers"])
def test_slow_mirror_meets_the_deadline(mirror, tmp_path, fault):
    getattr(mirror, fault).add("t10k-labels-idx1-ubyte.gz")
    url = mirror.url + "t10k-labels-idx1-ubyte.gz"
    start = time.monotonic()
    with pytest.raises(DataError, match="took longer than the deadline of 1 s") as info:
        dl.download(url, tmp_path / "x.gz", deadline=1, min_rate=0)
    assert time.monotonic() - start < 1 + 5  # bounded: the deadline plus a loaded machine's delay
    assert url in str(info.value) and "Nothing was saved" in str(info.value)
    assert names(tmp_path) == []


def test_slow_mirror_below_minimum_rate(mirror, tmp_path):
    mirror.slow.add("t10k-labels-idx1-ubyte.gz")
    url = mirror.url + "t10k-labels-idx1-ubyte.gz"
    with pytest.raises(DataError, match=r"arrives at \d+ bytes/s, below the minimum of 1000"):
        dl.download(url, tmp_path / "x.gz", min_rate=1000, rate_window=0.3)
    assert names(tmp_path) == []


def test_slow_mirror_through_the_data_layer(mirror, data_env, monkeypatch):
    mirror.slow.add("train-images-idx3-ubyte.gz")  # 39 kB at 20 bytes/s: half an hour
    monkeypatch.setattr(dl, "DEADLINE", 1)
    with pytest.raises(DataError, match="deadline of 1 s") as info:
        read_fashion_mnist()
    assert mirror.url + "train-images-idx3-ubyte.gz" in str(info.value)
    assert "To get the files" in str(info.value) and leftovers(data_env) == []


def test_endless_body_is_cut_off(mirror, data_env):
    mirror.files["t10k-labels-idx1-ubyte.gz"] = os.urandom(1 << 20)
    with pytest.raises(DataError, match=r"sends more than the \d+ bytes the file can have"):
        read_fashion_mnist()
    assert leftovers(data_env) == []


# --- a download killed mid-way leaves no .part for good (item 6) ---------------------------------

KILLED = (
    "import sys; from d2l_gpu.data.download import download; "
    "download(sys.argv[1], sys.argv[2], None)"
)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_download_leaves_no_part_for_good(mirror, data_env, sig):
    name = "t10k-labels-idx1-ubyte.gz"
    mirror.slow.add(name)
    data_env.mkdir(parents=True)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "no_proxy": "*"}
    argv = [sys.executable, "-c", KILLED, mirror.url + name, str(data_env / name)]
    child = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
    try:
        for _ in range(400):  # the request arrives after the child has locked its part
            if name in mirror.requests or child.poll() is not None:
                break
            time.sleep(0.05)
        part = leftovers(data_env)
        assert len(part) == 1 and child.poll() is None
        assert dl.remove_stale_parts(data_env / name) == []  # a live download's part is kept
        child.send_signal(sig)
        assert child.wait(timeout=30) == -sig
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert leftovers(data_env) == part  # the killed process could not remove it
    mirror.slow.clear()
    assert read_fashion_mnist()["test_labels"].shape == (N_TEST,)  # the next download cleans up
    assert leftovers(data_env) == [] and names(data_env) == GZ_NAMES


# --- a gzip bomb from the mirror (item 7) --------------------------------------------------------


@pytest.mark.parametrize(
    "announced, message",
    [(N_TRAIN, "extra bytes beyond"), (80_000, "announces 80000 images, this file should hold 50")],
)
def test_gzip_bomb_from_mirror_stopped_early_in_bounded_memory(
    mirror, data_env, announced, message
):
    bomb = gzip_bomb(images_header(announced), 64 << 20)  # 64 kB that inflate to 64 MB
    mirror.files["train-images-idx3-ubyte.gz"] = bomb
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match=message) as info:
            read_fashion_mnist()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB while refusing a 64 MiB bomb"
    assert mirror.url + "train-images-idx3-ubyte.gz" in str(info.value)
    assert "Nothing was saved" in str(info.value) and leftovers(data_env) == []
