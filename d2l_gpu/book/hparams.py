"""The book's object-oriented helpers (d2l 1.0): HyperParameters and add_to_class.

Book code builds its classes with these: `save_hyperparameters()` turns the arguments of
`__init__` into attributes, and `@add_to_class(C)` adds a method to `C` after the fact, which
is how the chapters grow a class one cell at a time.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable

from .._typed import wrap_public


def add_to_class(Class: type) -> Callable:
    """Decorator: set the decorated function as the attribute of `Class` with its name.

    The book's helper (d2l 1.0, docs/maintaining.md). Unlike the book's, it returns the function,
    so the decorated name stays usable where it was defined.
    """
    if not isinstance(Class, type):
        raise TypeError(f"add_to_class: Class must be a class such as d2l.Trainer, got {Class!r}")

    def register(obj):
        setattr(Class, obj.__name__, obj)
        return obj

    return register


class HyperParameters:
    """Base class whose `save_hyperparameters()` stores the caller's arguments as attributes."""

    def save_hyperparameters(self, ignore: Iterable[str] = ()) -> None:
        """Store the local variables of the calling `__init__` (but self, _names and `ignore`).

        The book's semantics: every local of the caller at the time of the call is saved, in
        `self.hparams` and as an attribute of the same name.
        """
        here = inspect.currentframe()
        frame = here.f_back if here is not None else None
        if frame is None:  # an interpreter without frames (not CPython): nothing to save
            raise RuntimeError("save_hyperparameters needs Python's frames (CPython)")
        try:
            local_vars = dict(frame.f_locals)
        finally:
            del frame, here  # no reference cycle through the frames
        skip = set(ignore) | {"self"}
        self.hparams = {
            k: v for k, v in local_vars.items() if k not in skip and not k.startswith("_")
        }
        for k, v in self.hparams.items():
            setattr(self, k, v)


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
