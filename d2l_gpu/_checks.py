"""Argument checks shared by the public functions: each refuses bad input at the call.

Each raises TypeError (wrong kind of value) or ValueError (right kind, wrong range) with a
sentence that names the argument, the value given and what to give instead. `name` is how the
sentence names the argument, e.g. "split_stages: k". Core code: torch is imported on first use.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Mapping
from typing import cast


def whole(name: str, value, *, least: int | None = 1, most: int | None = None) -> int:
    """`value` if it is an integer (numpy's too, not a bool) in [least, most], else a sentence.

    least=None checks the type alone (for a caller whose own sentence tells the range)."""
    span = f">= {least}" if most is None else f"from {least} to {most}"
    span = "" if least is None else f" {span}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a whole number{span}, got {value!r}")
    value = cast(int, value)  # an Integral: Python's int or numpy's, compared and returned as is
    if least is None:
        return value
    if value < least or (most is not None and value > most):
        raise ValueError(f"{name} must be a whole number{span}, got {value}")
    return value


def number(name: str, value, *, positive: bool = False) -> float:
    """`value` if it is a finite real number >= 0 (> 0 when `positive`), else a sentence."""
    bound = "> 0" if positive else ">= 0"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number {bound}, got {value!r}")
    value = cast(float, value)  # a Real: returned as it came
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be a finite number {bound}, got {value}")
    return value


MOST = 1e9  # seconds (31 years), a rate, a learning rate, a delay: no flag needs more


def positive_arg(text: str) -> float:
    """argparse type: a number above zero, at most MOST (seconds, a rate), else a sentence."""
    return _number_arg(text, 0.0, above=True)


def rate_arg(text: str) -> float:
    """argparse type: a finite number above zero, however large (a learning rate: one of 1e30 is
    a lesson's way to make a loss overflow), else argparse's sentence."""
    return _number_arg(text, 0.0, above=True, most=math.inf)


def nonnegative_arg(text: str) -> float:
    """argparse type: a number from 0 to MOST (a delay), else argparse's sentence."""
    return _number_arg(text, 0.0, above=False)


def count_arg(text: str) -> int:
    """argparse type: a whole number from 1 to 2**63 - 1 (a count, a size), else a sentence."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to 2**63 - 1, not {text}")
    return value


def _number_arg(text: str, bound: float, *, above: bool, most: float = MOST) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < bound or (above and value == bound) or value > most:
        sign = ">" if above else ">="
        upto = f" and at most {most:g}" if math.isfinite(most) else ""
        raise argparse.ArgumentTypeError(
            f"must be a finite number {sign} {bound:g}{upto}, got {text}"
        )
    return value


def floating_dtype(name: str, value):
    """`value` if it is a floating torch.dtype such as torch.float32, else a sentence."""
    import torch

    if not (isinstance(value, torch.dtype) and value.is_floating_point):
        raise TypeError(
            f"{name} must be a floating torch.dtype such as torch.float32, got {value!r}"
        )
    return value


def job(caller: str, job) -> None:
    """The settings every training job shares (steps, lr, seed, dtype), each with a sentence."""
    whole(f"{caller}: steps", job.steps)
    number(f"{caller}: lr", job.lr, positive=True)
    whole(f"{caller}: seed", job.seed, least=0)
    floating_dtype(f"{caller}: dtype", job.dtype)


def callable_(name: str, value, *, no_args: bool = False) -> Callable:
    """`value` if it can be called (with `no_args`: with no arguments), else a sentence."""
    if not callable(value):
        raise TypeError(f"{name} must be a function to call (e.g. lambda: ...), got {value!r}")
    if no_args:
        from torch import nn

        called = value.forward if isinstance(value, nn.Module) else value  # __call__ takes *args
        try:
            inspect.signature(called).bind()
        except TypeError:  # it needs arguments: a module's forward, a function of X
            raise TypeError(
                f"{name} is called with no arguments, but {type(value).__name__} needs some: "
                "wrap the call, e.g. lambda: net(X)"
            ) from None
        except ValueError:  # no signature to read (some built-ins): called as it is
            pass
    return value


def one_of(name: str, value, choices) -> object:
    """`value` if it is one of `choices` (a dict's keys, a tuple), else a sentence listing them."""
    try:
        found = value in choices
    except TypeError:  # an unhashable value (a list) asked of a dict
        found = False
    if not found:
        known = ", ".join(map(repr, choices))
        raise ValueError(f"{name} must be one of {known}, got {value!r}")
    return value


def items(name: str, value, *, least: int = 1) -> list:
    """`value` as a list if it is a list-like of at least `least` items (not a str or a dict)."""
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{name} must be a list, got {value!r}")
    value = list(value)
    if len(value) < least:
        raise ValueError(f"{name} must hold at least {least} item(s), got {value!r}")
    return value


def pairs(name: str, data_iter):
    """The batches of `data_iter`, each refused with a sentence unless it is an (X, y) pair."""
    for i, batch in enumerate(data_iter):
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            raise TypeError(f"{name} must give (X, y) batches, got {batch!r:.60} as batch {i}")
        yield batch


def module(name: str, value, *, sequential: bool = False):
    """`value` if it is an nn.Module (an nn.Sequential when `sequential`), else a sentence."""
    from torch import nn

    kind = nn.Sequential if sequential else nn.Module
    if not isinstance(value, kind):
        hint = "; put its layers in nn.Sequential(...)" if sequential else ""
        raise TypeError(f"{name} must be an nn.{kind.__name__}, got {type(value).__name__}{hint}")
    return value


def device(name: str, value, *, available: bool = False, optional: bool = False):
    """`value` as a torch.device, refused with a sentence if PyTorch does not know the name or
    (with `available`) this machine cannot hold data on it; None stays None when `optional`."""
    import torch

    if optional and value is None:
        return None
    try:
        where = torch.device(value)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(
            f"{name} {value!r} is not a device PyTorch knows; pass 'cpu', 'cuda:0', a "
            "torch.device or d2l.try_gpu()"
        ) from None
    if available and where.type not in ("cpu", "meta"):
        try:
            torch.empty(0, device=where)
        except (RuntimeError, AssertionError) as e:  # "Torch not compiled with CUDA enabled"
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ValueError(
                f"{name} {str(where)!r} is not available on this machine ({reason}); pass "
                "d2l.try_gpu() to use an accelerator only where there is one, or 'cpu'"
            ) from None
    return where


def devices(name: str, value, *, available: bool = False) -> list:
    """`value` as a non-empty list of torch.devices (a list, not a string), else a sentence."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(
            f"{name} must be a list of devices such as [d2l.try_gpu()] or d2l.try_all_gpus(), "
            f"got {value!r}"
        )
    found = [device(f"{name} entry", d, available=available) for d in value]
    if not found:
        raise ValueError(f"{name} must name at least one device (d2l.try_all_gpus()), got []")
    return found


def loop(caller: str, net, train_iter, num_epochs) -> None:
    """Refuse what would fail only once a training loop has started, or leave it nothing to say:
    a net that is no nn.Module, a count of epochs below 1, batches that are none."""
    module(f"{caller}: net", net)
    whole(f"{caller}: num_epochs", num_epochs)
    if len(train_iter) == 0:
        raise ValueError(f"{caller}: train_iter has no batches; give it at least one batch")


def has_grad(caller: str, param) -> None:
    """Refuse a parameter without a gradient, where an update needs one."""
    if param.grad is None:
        raise ValueError(
            f"{caller}: a parameter of shape {tuple(param.shape)} has no gradient; call "
            "l.backward() first, with requires_grad=True on every parameter"
        )


def ranks(caller: str, rank, world, *, least: int = 1) -> None:
    """Refuse a world size below `least` or a rank outside 0..world-1, naming `caller`."""
    whole(f"{caller}: world", world, least=least)
    whole(f"{caller}: rank", rank, least=0, most=world - 1)


def in_group(caller: str, rank=None, world=None) -> None:
    """Refuse a call outside a process group, or with a rank or size that is not this process's."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{caller} needs a process group and none is open: call it in every rank, in a "
            "worker started by d2l.run_workers(worker, world_size, ...)"
        )
    actual = (dist.get_rank(), dist.get_world_size())
    if world is not None and (rank, world) != actual:
        raise ValueError(
            f"{caller} was given rank={rank}, world={world}, but this process is rank "
            f"{actual[0]} of a group of {actual[1]}: pass the rank and size the worker was given"
        )
