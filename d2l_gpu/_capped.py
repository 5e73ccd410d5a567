"""A rank's standard output, cut after a limit: a worker that prints in a loop cannot flood the
notebook (or the log) that started it. Used by `run_workers` (d2l_gpu.workers) for every rank."""

from __future__ import annotations

import sys

LIMIT = 1 << 20  # characters a rank may print: far more than any lesson's rank prints


class Capped:
    """A text stream that passes on the first `limit` characters, then says once what it cut."""

    def __init__(self, stream, rank: int, limit: int = LIMIT):
        self.stream, self.rank, self.limit, self.left = stream, rank, limit, limit

    def write(self, text: str) -> int:
        if self.left > 0:
            self.stream.write(text[: self.left])
            if len(text) > self.left:
                self.stream.write(
                    f"\n[rank {self.rank} printed more than {self.limit:,} characters: the rest "
                    "of its output is cut; print less, e.g. only on rank 0 or every 100th step]\n"
                )
                self.stream.flush()
            self.left -= len(text)
        return len(text)

    def __getattr__(self, name):  # flush, fileno, isatty, encoding, ...: the stream's own
        return getattr(self.stream, name)


def cap_stdout(rank: int) -> None:
    """From now on, this process's print() goes through Capped."""
    if not isinstance(sys.stdout, Capped):
        sys.stdout = Capped(sys.stdout, rank)
