"""Verified, atomic downloads into a per-user cache (used by d2l_gpu.data).

A download goes to a temporary file in the destination folder, is fsynced and checked (length and
SHA-256 of the decompressed content), and only then renamed over the destination with os.replace.
Any failure removes the temporary file, so a partial or unverified file never takes a real name and
a good existing copy is never lost.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import sys
import tempfile
import urllib.request
import zlib
from pathlib import Path

from ._fs import sync_folder

TIMEOUT = 30  # seconds without data before a download gives up
CHUNK = 1 << 16


class DataError(RuntimeError):
    """A data file is missing, unreachable, truncated, corrupt, or fails its checksum."""


def cache_dir(name: str) -> Path:
    """Return the per-user cache folder $XDG_CACHE_HOME/d2l_gpu/<name> (default ~/.cache/...)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / "d2l_gpu" / name


def read_bytes(path: str | os.PathLike) -> bytes:
    """Return the content of `path`, gunzipped when it holds gzip data (whatever its name)."""
    data = Path(path).read_bytes()
    if data[:2] != b"\x1f\x8b":
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(
            f"{path} is not a valid gzip file ({e}): it is truncated or corrupt. "
            "Delete or replace it with a good copy."
        ) from e


def check_sha256(data: bytes, expected: str, where: str | os.PathLike) -> None:
    """Raise DataError unless the SHA-256 of `data` (decompressed content) is `expected`."""
    got = hashlib.sha256(data).hexdigest()
    if got != expected.lower():
        raise DataError(
            f"{where}: SHA-256 of the decompressed content is {got}, expected {expected}. "
            "The file is corrupt or not the right one; delete or replace it with a good copy."
        )


def download(url: str, dest: str | os.PathLike, sha256: str, *, progress: bool = True) -> Path:
    """Download `url` to `dest` atomically; its decompressed content must have SHA-256 `sha256`."""
    dest = Path(dest)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            try:
                with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
                    total = int(response.headers.get("Content-Length") or 0)
                    done = _copy(response, f, total, dest.name if progress else None)
            except (OSError, http.client.HTTPException) as e:  # URLError is an OSError
                raise DataError(f"could not download {url}: {e}") from e
            if total and done != total:
                raise DataError(f"download of {url} is truncated: got {done} of {total} bytes")
            f.flush()
            os.fsync(f.fileno())
        check_sha256(read_bytes(tmp), sha256, url)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    sync_folder(dest.parent)
    return dest


def _copy(src, dst, total: int, label: str | None) -> int:
    """Copy `src` to `dst` in chunks, drawing a text progress bar on stderr; return bytes copied."""
    done, shown = 0, None
    while chunk := src.read(CHUNK):
        dst.write(chunk)
        done += len(chunk)
        mark = done * 100 // total if total else done >> 20  # percent, or MB when size unknown
        if label and mark != shown:
            shown = mark
            bar = f"{mark:3d}% [{'#' * (mark // 5):<20}]" if total else f"{mark} MB"
            sys.stderr.write(f"\r  {label}: {bar} {done / 1e6:.1f} MB")
            sys.stderr.flush()
    if label:
        sys.stderr.write("\n")
    return done
