"""File-system helpers shared by downloads, checkpoints and the notebook tools: nothing is ever
written in place, and a renamed file's folder entry reaches the disk."""

from __future__ import annotations

import contextlib
import glob
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def sync_folder(folder: Path) -> None:
    """Flush the folder entry of a renamed file to disk (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_file(path, write: Callable[[BinaryIO], object]) -> Path:
    """Write `path` all or nothing: `write(f)` fills a temporary file beside it, which is flushed
    to disk and renamed over `path`; a crash at any point leaves the old file intact. A symbolic
    link is written through: its target gets the new content and the link stays a link."""
    path = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():  # keep the old file's permissions
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    sync_folder(path.parent)
    for stale in glob.glob(os.path.join(glob.escape(str(path.parent)), f".{path.name}.*.tmp")):
        with contextlib.suppress(OSError):  # left by a writer that was killed mid-write
            os.unlink(stale)
    return path


def write_atomic(path: str | os.PathLike, data: bytes | str, encoding: str = "utf-8") -> Path:
    """Write `data` to `path` through a temporary file, fsync and rename: all or nothing."""
    raw = data.encode(encoding) if isinstance(data, str) else data
    return replace_file(path, lambda f: f.write(raw))
