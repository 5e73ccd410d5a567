"""Argument checks shared by the public functions: each refuses bad input at the call.

Each raises TypeError (wrong kind of value) or ValueError (right kind, wrong range) with a
sentence that names the argument, the value given and what to give instead.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable


def whole(name: str, value, *, least: int = 1) -> int:
    """`value` if it is an integer (numpy's too, not a bool) >= least, else a sentence."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a whole number >= {least}, got {value!r}")
    if value < least:
        raise ValueError(f"{name} must be a whole number >= {least}, got {value}")
    return value


def callable_(name: str, value) -> Callable:
    """`value` if it can be called, else a sentence naming `name`."""
    if not callable(value):
        raise TypeError(f"{name} must be a function to call (e.g. lambda: ...), got {value!r}")
    return value
