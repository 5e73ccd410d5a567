"""Fashion-MNIST's IDX files, parsed strictly and streamed from gzip in bounded memory.

An IDX file is a 4-byte magic number, one 4-byte big-endian size per dimension, then the uint8
values. read_idx checks the header (magic, dimensions, the number of examples expected) before it
inflates anything else and never inflates more than the header announces, so a gzip "bomb" is
refused after a few kilobytes instead of filling the memory. The SHA-256 of the decompressed
content is computed on the way.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import math
import os
import struct
import zlib

import numpy as np

from .download import DataError

IMAGE_SHAPE = (28, 28)
NUM_CLASSES = 10
MAX_EXAMPLES = 1_000_000  # the most examples a header may announce when no count is expected
KINDS = {"images": (0x00000803, 3), "labels": (0x00000801, 1)}  # magic number, number of dims
REPLACE = (
    "Replace it with a good copy (delete it to have it downloaded again into the cache, or "
    "reinstall the package dataset-fashion-mnist)."
)
CHUNK = 1 << 20


class _Bad(Exception):
    """What is wrong with the content (the caller adds where and what to do)."""


def parse_idx(data: bytes, kind: str, where: str | os.PathLike = "IDX data") -> np.ndarray:
    """Parse IDX `data` of `kind` 'images' (N,28,28) or 'labels' (N,) into uint8, strictly."""
    try:
        return _parse(io.BytesIO(data), kind, None, None)
    except _Bad as e:
        raise DataError(f"{where}: {e}. {REPLACE}") from None


def read_idx(
    path: str | os.PathLike,
    kind: str,
    *,
    count: int | None = None,
    sha256: str | None = None,
    where: str | os.PathLike | None = None,
    advice: str = REPLACE,
) -> np.ndarray:
    """Read the IDX file `path` (raw or gzipped) of `kind`, holding `count` examples if given.

    `sha256` is that of the decompressed content; errors name `where` (default `path`) and end
    with `advice`.
    """
    where = path if where is None else where
    digest = hashlib.sha256() if sha256 else None
    try:
        with open(path, "rb") as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            with gzip.GzipFile(fileobj=raw) if gzipped else contextlib.nullcontext(raw) as f:
                array = _parse(f, kind, count, digest)
    except _Bad as e:
        raise DataError(f"{where}: {e}. {advice}") from None
    except EOFError:
        raise DataError(f"{where}: the gzip data ends early (it is truncated). {advice}") from None
    except (gzip.BadGzipFile, zlib.error) as e:
        raise DataError(f"{where}: not a valid gzip file ({e}). {advice}") from None
    except MemoryError:
        raise DataError(f"{where}: too large for this machine's memory. {advice}") from None
    except PermissionError:
        raise DataError(
            f"cannot read {path}: permission denied. Give your user read access to it (for "
            "example chmod u+r FILE, or ask its owner), or use a copy you can read."
        ) from None
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e}. {advice}") from None
    if sha256 and digest is not None and digest.hexdigest() != sha256.lower():
        raise DataError(
            f"{where}: SHA-256 of the decompressed content is {digest.hexdigest()}, expected "
            f"{sha256}; it is corrupt or not the right file. {advice}"
        )
    return array


def _parse(f, kind: str, count: int | None, digest) -> np.ndarray:
    """Read one IDX array of `kind` from the binary file `f`, checking it as it arrives."""
    magic, ndim = KINDS[kind]
    start = 4 + 4 * ndim
    head = f.read(start)
    if len(head) < start:
        raise _Bad(f"truncated IDX header ({len(head)} bytes, need {start})")
    got = int.from_bytes(head[:4], "big")
    if got != magic:
        raise _Bad(f"not an IDX {kind} file (magic 0x{got:08x}, want 0x{magic:08x})")
    dims = struct.unpack(f">{ndim}I", head[4:])
    if dims[0] == 0 or (kind == "images" and dims[1:] != IMAGE_SHAPE):
        raise _Bad(f"wrong dimensions {dims} for Fashion-MNIST {kind}")
    if count is not None and dims[0] != count:
        raise _Bad(f"the header announces {dims[0]} {kind}, this file should hold {count}")
    if dims[0] > MAX_EXAMPLES:
        raise _Bad(f"the header announces {dims[0]} {kind}, more than the {MAX_EXAMPLES} accepted")
    if digest is not None:
        digest.update(head)
    size = start + math.prod(dims)
    array = np.empty(math.prod(dims), dtype=np.uint8)
    view, done = memoryview(array.data), 0
    while done < len(array):
        n = f.readinto(view[done : done + CHUNK])
        if not n:
            raise _Bad(f"IDX file truncated: {start + done} bytes, header says {size}")
        if digest is not None:
            digest.update(view[done : done + n])
        done += n
    if f.read(1):  # one byte past the announced size: stop here, however much more there is
        raise _Bad(f"IDX file has extra bytes beyond the {size} its header announces")
    array = array.reshape(dims)
    if kind == "labels" and array.max() >= NUM_CLASSES:
        i = int(np.argmax(array >= NUM_CLASSES))
        raise _Bad(f"label {array[i]} at index {i} is outside 0..{NUM_CLASSES - 1}")
    return array
