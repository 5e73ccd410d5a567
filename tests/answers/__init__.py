"""Right and wrong answers for every exercise check of the lessons (tests/test_exercise_checks.py).

One module per lesson, named after it (`l05.py` for `notebooks/05-data-parallel.ipynb`), holds
`NOTEBOOK` (the lesson's file name) and `CASES`: one `Case` for each check cell of the lesson's
exercises. A case runs a few of the lesson's own cells (`context`), then its answer's `code`, then
the check cell itself with its answer's `replace` edits applied, and reads the check's verdict:

- with `right` the check must pass: it prints `correct`, or a last line ending in `: True`;
- with `wrong`, a plausible mistake a student makes (not the unanswered `...`), it must not.

So a check that cannot fail, or that fails for the wrong reason (a missing name, an exception in
the harness), is caught: the right answer proves the case ran, the wrong one that it can refuse.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Answer:
    """What a student wrote: code run before the check cell, and edits of the check cell."""

    code: str = ""
    replace: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Case:
    """One exercise check fed a right and a plausible wrong answer."""

    cell: str  # a substring found in the check cell's source and in no other cell
    right: Answer
    wrong: Answer
    why: str  # the mistake that `wrong` stands for, in a few words
    context: tuple[str, ...] = ()  # substrings that pick earlier cells of the lesson, run first
    # run the context once for every case that names the same cells, and give each answer a copy
    # of its names: for a context that takes seconds (ranks started) and that no check changes
    shared_context: bool = False
