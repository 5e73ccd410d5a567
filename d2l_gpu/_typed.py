"""`typed`: a public function that fails on an argument of the wrong kind says which one.

The annotations that mypy checks in the package's own calls are read again when a student's
call fails: `d2l.accuracy("logits", y)` says "accuracy: y_hat must be a torch.Tensor, got
'logits'" instead of an AttributeError from deep inside. Ranges (a count >= 1, a finite rate)
stay with each function's own checks (`_checks`), which speak first; `typed` adds one range that
holds for every whole-number argument: it fits in 64 bits, as PyTorch needs.
When every argument has the right kind, two more are read: a device (or list of devices) this
machine does not have, or an empty list of them, is named; and where PyTorch failed inside a
module given to the call, the tensors given with it are named with their shapes.

Lenient where Python and PyTorch are: a float accepts any real number (ints and NumPy's
included), an int any integral one, a torch.device also a name such as "cpu" or an index, a
Path also a str. An annotation that cannot be read (a name the module does not have) is not
checked. Each module that gives `d2l.` names ends with `wrap_public(globals())`, which wraps
them in place; the source a lesson prints or shows (`# @save`) stays the function as written.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import numbers
import os
import sys
import traceback
import types
import typing
from collections.abc import Mapping
from pathlib import Path

from . import _checks

INT64 = (-(2**63), 2**63 - 1)
PACKAGE = str(Path(__file__).parent)
_ANY = object()  # a hint that accepts everything


def typed(fn):
    """`fn`, whose errors from an argument of the wrong kind become one sentence naming it.

    Nothing is checked on the way in: a call that works costs a `try`. When `fn` fails with an
    error the package did not raise on purpose (from inside PyTorch, or Python's own on a value
    of the wrong kind), the arguments are read against the annotations, and the first that does
    not fit is named instead (for a collective outside a process group, the missing group). A
    refusal of the package's own, or a failure with every argument of the right kind (out of
    memory, say), passes through unchanged."""
    sig = inspect.signature(fn)
    name = fn.__qualname__.removesuffix(".__init__").rpartition(".<locals>.")[2]

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as error:
            if deliberate(error):
                raise
            sentence = (
                misfit(fn, sig, name, args, kwargs)
                or outside_group(name, error)
                or does_not_fit(sig, name, args, kwargs, error)
            )
            if sentence is None:
                raise
            raise sentence.with_traceback(None) from None  # ours: its traceback ends here

    return checked


def wrap_public(namespace: dict) -> None:
    """Give every public name of a module (`namespace`: its globals) the `typed` treatment.

    Called as the module's last line, so that every importer, pickle included, finds the
    wrapped function: the public names are those d2l_gpu._NAMES lists for the module; a class
    gets its own `__init__` wrapped. A wrapped function's source stays as written (inspect
    reads the function inside), which the lessons print."""
    module = namespace["__name__"]
    names = sys.modules["d2l_gpu"]._NAMES.get(module.removeprefix("d2l_gpu."), [])
    for name in names:
        obj = namespace.get(name)  # a name given by the module's __getattr__ (plt) is left
        if isinstance(obj, type):
            init = vars(obj).get("__init__")
            if init is not None and not hasattr(init, "__wrapped__"):
                obj.__init__ = typed(init)  # type: ignore[misc]
        elif inspect.isfunction(obj) and not hasattr(obj, "__wrapped__"):
            namespace[name] = typed(obj)


def misfit(fn, sig: inspect.Signature, name: str, args, kwargs) -> Exception | None:
    """The error naming the first argument that does not fit its annotation, or None."""
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as e:
        return TypeError(f"{name}: {e}")
    hints = _hints(fn, sig)
    for arg, value in bound.arguments.items():
        hint = hints.get(arg, _ANY)
        if hint is not _ANY and not fits(value, hint):
            return TypeError(f"{name}: {arg} must be {describe(hint)}, got {_show(value)}")
        if isinstance(value, numbers.Integral) and not INT64[0] <= int(value) <= INT64[1]:
            return ValueError(f"{name}: {arg} must fit in PyTorch's int64, got {value}")
    for arg, value in bound.arguments.items():  # every kind fits: is a device missing?
        said = _device_missing(f"{name}: {arg}", value, hints.get(arg, _ANY))
        if said is not None:
            return said
    return None


def _is_device(hint) -> bool:
    return isinstance(hint, type) and hint.__module__ == "torch" and hint.__name__ == "device"


def _device_missing(name: str, value, hint) -> Exception | None:
    """The sentence for a device (or list of devices) in `value` that this machine cannot use,
    or an empty list of devices, where `hint` names torch.device; else None."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        devices = [a for a in args if _is_device(a) or typing.get_origin(a) in (list, tuple)]
        return _device_missing(name, value, devices[0]) if len(devices) == 1 else None
    try:
        if _is_device(hint):
            _checks.device(name, value, available=True)
        elif origin in (list, tuple) and args and _is_device(args[0]):
            _checks.devices(name, value, available=True)
    except ValueError as e:
        return e
    return None


def outside_group(name: str, error: Exception) -> Exception | None:
    """The package's sentence for a collective called where no process group is open, or None."""
    if "process group" not in str(error):
        return None
    try:
        _checks.in_group(name)
    except RuntimeError as e:
        return e
    return None


def does_not_fit(sig: inspect.Signature, name: str, args, kwargs, error) -> Exception | None:
    """The sentence for tensors of the call that one of its modules could not take (PyTorch's
    error about a shape or a type, raised inside PyTorch), naming them and their shapes; else
    None."""
    import torch

    frames = traceback.extract_tb(error.__traceback__)
    torch_dir = str(Path(torch.__file__).parent)
    if not isinstance(error, (RuntimeError, ValueError, IndexError, TypeError)) or not (
        frames and frames[-1].filename.startswith(torch_dir)
    ):
        return None
    try:
        given = sig.bind(*args, **kwargs).arguments
    except TypeError:
        return None
    modules = [a for a, v in given.items() if isinstance(v, torch.nn.Module)]
    tensors = {a: v for a, v in given.items() if isinstance(v, torch.Tensor)}
    if not modules or not tensors:
        return None
    shapes = ", ".join(
        f"{a} {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}" for a, v in tensors.items()
    )
    said = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    return ValueError(
        f"{name}: {shapes} do not fit {' and '.join(modules)} ({type(error).__name__}: {said}); "
        "give inputs of the shape and type the network was built for"
    )


def deliberate(error: BaseException) -> bool:
    """Whether `error` came from a `raise` statement of the package (a refusal of its own)."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return False
    last, raised = frames[-1], f"raise {type(error).__name__}("
    if last.filename == __file__:  # the sentence of a function this one called: ours first
        return False
    # `raise ValueError(f"... {k - 1}")` with a str k fails with a TypeError on that very line
    return last.filename.startswith(PACKAGE) and (last.line or "").lstrip().startswith(raised)


def _hints(fn, sig: inspect.Signature) -> dict[str, object]:
    """Each annotated parameter's annotation as an object (strings evaluated in fn's module)."""
    found: dict[str, object] = {}
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.annotation is p.empty:
            continue
        hint = p.annotation
        if isinstance(hint, str):
            try:
                hint = eval(hint, fn.__globals__)  # noqa: S307 - the package's own annotations
            except Exception:  # noqa: BLE001 - a name the module lacks at run time: not checked
                continue
        found[p.name] = hint
    return found


def fits(value, hint) -> bool:
    """Whether `value` is of the kind `hint` names (leniently; see the module's docstring)."""
    if hint in (typing.Any, object, _ANY) or isinstance(hint, typing.TypeVar):
        return True
    if hint is None or hint is type(None):
        return value is None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if origin is collections.abc.Callable or hint is collections.abc.Callable:
        return callable(value)
    if origin is type:
        return isinstance(value, type)
    if origin is not None:
        return _fits_container(value, origin, args)
    return _fits_class(value, hint)


def _fits_container(value, origin, args) -> bool:
    if not isinstance(origin, type):
        return True
    if origin in (list, tuple):  # either, where a function reads its items
        if not isinstance(value, (list, tuple)):
            return False
    elif not _isinstance(value, origin):
        return False
    if origin is tuple and args and args[-1] is not Ellipsis:
        return len(value) == len(args) and all(fits(v, a) for v, a in zip(value, args, strict=True))
    item = args[0] if args and origin is not dict and not issubclass(origin, Mapping) else None
    if item is None:
        return True
    if isinstance(value, str):  # a str is a sequence of str, never of numbers or tensors
        return item is str
    if isinstance(value, (list, tuple, set, frozenset)):  # items readable without consuming
        return all(fits(v, item) for v in list(value)[:1000])
    return True


def _fits_class(value, hint) -> bool:
    if not isinstance(hint, type):
        return True  # a protocol, a NewType or another construct: left to the function
    if hint is float:
        return isinstance(value, numbers.Real)
    if hint is int:  # a count or an index: True is not one (as in _checks.whole)
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if hint is complex:
        return isinstance(value, numbers.Number)
    if issubclass(hint, Path):
        return isinstance(value, (str, os.PathLike))
    if hint.__module__ == "torch" and hint.__name__ == "device":
        return isinstance(value, (hint, str, int)) and not isinstance(value, bool)
    return _isinstance(value, hint)


def _isinstance(value, kind: type) -> bool:
    try:
        return isinstance(value, kind)
    except TypeError:  # a generic alias or a protocol that cannot be tested at run time
        return True


def describe(hint) -> str:
    """`hint` in words: 'a torch.Tensor', 'a whole number', 'a list', 'None or a torch.device'."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if hint is None or hint is type(None):
        return "None"
    if origin is collections.abc.Callable or hint is collections.abc.Callable:
        return "a function"
    kind = origin or hint
    words = {int: "a whole number", float: "a number", str: "a str", bool: "True or False",
             list: "a list", tuple: "a tuple", dict: "a dict"}  # fmt: skip
    abc = {"Iterable": "an iterable (a list, a tuple, a tensor, a DataLoader)",
           "Sequence": "a list or a tuple", "Mapping": "a dict"}  # fmt: skip
    if kind in words:
        return words[kind]
    if isinstance(kind, type) and kind.__module__ == "collections.abc":
        return abc.get(kind.__name__, f"a {kind.__name__}")
    if isinstance(kind, type):
        module = kind.__module__
        prefixes = (("torch.nn", "nn."), ("torch.optim", "torch.optim."), ("torch", "torch."),
                    ("d2l_gpu", "d2l."), ("builtins", ""))  # fmt: skip
        for start, prefix in prefixes:
            if module.startswith(start):
                return f"a {prefix}{kind.__name__}"
        return f"a {module}.{kind.__name__}"
    return str(hint)


def _show(value) -> str:
    """A short repr of `value` for a sentence."""
    text = repr(value)
    return text if len(text) <= 60 else f"a {type(value).__name__}"
