"""Verified, atomic, bounded downloads into a per-user cache (used by d2l_gpu.data.fashion_mnist).

A download goes to a temporary `.NAME.XXXXXXXX.part` file in the destination folder, is fsynced and
checked by the caller's `verify`, and only then renamed over the destination with os.replace. Any
failure removes the temporary file, so a partial or unverified file never takes a real name and a
good existing copy is never lost. A process killed mid-download (SIGKILL, SIGTERM) cannot remove
its `.part`; each download holds a lock on its own, which the kernel drops when the process dies,
so the next download of that file removes every `.part` whose lock is free.

Nothing waits for ever: each read gives up after TIMEOUT seconds without data, a mirror slower than
MIN_RATE bytes/s over RATE_WINDOW seconds is given up on, and a watchdog closes the connection when
the whole download passes DEADLINE seconds, wherever it is blocked.
"""

from __future__ import annotations

import contextlib
import glob
import http.client
import os
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from .._fs import sync_folder

try:
    import fcntl
except ImportError:  # Windows: stale parts are recognised by their age instead
    fcntl = None  # type: ignore[assignment]

TIMEOUT = 30  # seconds without any data before a read gives up
DEADLINE = 20 * 60  # seconds a whole download may take
MIN_RATE = 2048  # bytes/s: a mirror slower than this over a RATE_WINDOW is given up on
RATE_WINDOW = 60  # seconds over which the rate is measured
CHUNK = 1 << 16


class DataError(RuntimeError):
    """A data file is missing, unreadable, truncated, corrupt, or fails its checksum.

    Raised by every loader of lesson 1 on; its message names the file and what to do.
    """


def cache_dir(name: str) -> Path:
    """Return the per-user cache folder $XDG_CACHE_HOME/d2l_gpu/<name> (default ~/.cache/...)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / "d2l_gpu" / name


def remove_stale_parts(dest: str | os.PathLike) -> list[Path]:
    """Remove the `.part` files that dead downloads of `dest` left behind; return their paths."""
    dest, removed = Path(dest), []
    for part in dest.parent.glob(f".{glob.escape(dest.name)}.*.part"):
        with contextlib.suppress(OSError):
            if fcntl is None:  # no locks: only a part older than any live download is stale
                if time.time() - part.stat().st_mtime > DEADLINE + TIMEOUT:
                    part.unlink()
                    removed.append(part)
                continue
            fd = os.open(part, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: its download is alive
                part.unlink()
                removed.append(part)
            finally:
                os.close(fd)
    return removed


def _new_part(dest: Path) -> tuple[int, str]:
    """Create and lock the temporary file of a download of `dest`; return (fd, path)."""
    while True:
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
        if fcntl is None:
            return fd, tmp
        fcntl.flock(fd, fcntl.LOCK_EX)  # waits only while a cleaner looks at this new file
        if os.fstat(fd).st_nlink:  # not removed by a cleaner before we held the lock
            return fd, tmp
        os.close(fd)


class _Watchdog:
    """Shuts the download's connections down when `seconds` pass, wherever the download waits."""

    def __init__(self, seconds: float):
        self.sockets: list[socket.socket] = []
        self.fired = False
        self.timer = threading.Timer(seconds, self._fire)
        self.timer.daemon = True

    def _fire(self) -> None:
        self.fired = True
        for sock in self.sockets:  # the base method: for TLS too, without touching its state
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def opener(self) -> urllib.request.OpenerDirector:
        """An opener whose HTTP(S) connections this watchdog can shut down."""
        watch = self

        class Watched:
            def do_open(self, http_class, req, **kwargs):
                def connection(*args, **kw):
                    conn = http_class(*args, **kw)
                    connect = conn.connect

                    def watched_connect():
                        connect()
                        watch.sockets.append(conn.sock)
                        if watch.fired:  # the deadline passed while connecting
                            watch._fire()

                    conn.connect = watched_connect
                    return conn

                return super().do_open(connection, req, **kwargs)

        class HTTP(Watched, urllib.request.HTTPHandler):
            pass

        class HTTPS(Watched, urllib.request.HTTPSHandler):
            pass

        return urllib.request.build_opener(HTTP, HTTPS)


def download(
    url: str,
    dest: str | os.PathLike,
    verify: Callable[[Path], object] | None = None,
    *,
    max_bytes: int | None = None,
    deadline: float | None = None,
    min_rate: float | None = None,
    rate_window: float | None = None,
    progress: bool | None = None,
) -> Path:
    """Download `url` to `dest` atomically, after `verify(temporary_path)` returned without error.

    `max_bytes` caps the size; `deadline`, `min_rate`, `rate_window` default to the module's
    DEADLINE, MIN_RATE, RATE_WINDOW; `progress` (default: when stderr is a terminal) draws a bar.
    """
    dest = Path(dest)
    remove_stale_parts(dest)
    deadline = DEADLINE if deadline is None else deadline
    limits = (max_bytes, MIN_RATE if min_rate is None else min_rate, rate_window or RATE_WINDOW)
    fd, tmp = _new_part(dest)
    watch = _Watchdog(deadline)
    late = f"it took longer than the deadline of {deadline:g} s"
    try:
        with os.fdopen(fd, "wb") as f:
            watch.timer.start()
            try:
                with watch.opener().open(url, timeout=TIMEOUT) as response:
                    total = int(response.headers.get("Content-Length") or 0)
                    done = _copy(response, f, url, total, limits, dest.name, progress)
            except (OSError, http.client.HTTPException, ValueError) as e:  # URLError is an OSError
                if watch.fired:
                    raise _gave_up(url, late) from e
                raise DataError(f"could not download {url}: {e}. Nothing was saved.") from e
            finally:
                watch.timer.cancel()
                watch.timer.join()
            if watch.fired:
                raise _gave_up(url, late)
            if total and done != total:
                raise DataError(
                    f"the download of {url} is truncated: got {done} of {total} bytes. Nothing "
                    "was saved; try again."
                )
            f.flush()
            os.fsync(f.fileno())
        if verify is not None:
            verify(Path(tmp))
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    sync_folder(dest.parent)
    return dest


def _gave_up(url: str, why: str) -> DataError:
    return DataError(
        f"gave up on the download of {url}: {why}. Nothing was saved; try again later, from a "
        "faster mirror, or download the file by hand."
    )


def _copy(src, dst, url: str, total: int, limits: tuple, label: str, progress) -> int:
    """Copy `src` to `dst` as data arrives (one read per network packet); return bytes copied."""
    from tqdm import tqdm  # noqa: PLC0415 - only when downloading

    max_bytes, min_rate, window = limits
    done, start, start_done = 0, time.monotonic(), 0
    disable = None if progress is None else not progress  # None: a bar only on a terminal
    bar = tqdm(total=total or None, desc=label, unit="B", unit_scale=True, unit_divisor=1024,
               file=sys.stderr, disable=disable)  # fmt: skip
    with bar:
        while chunk := src.read1(CHUNK):
            dst.write(chunk)
            done += len(chunk)
            bar.update(len(chunk))
            if max_bytes is not None and done > max_bytes:
                raise _gave_up(url, f"it sends more than the {max_bytes} bytes the file can have")
            now = time.monotonic()
            if now - start >= window:
                rate = (done - start_done) / (now - start)
                if rate < min_rate:
                    raise _gave_up(
                        url, f"it arrives at {rate:.0f} bytes/s, below the minimum of {min_rate:g}"
                    )
                start, start_done = now, done
    return done
