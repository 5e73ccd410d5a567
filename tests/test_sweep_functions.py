"""Every public function of the package, called with values nobody thought of (issue 46).

`hypothesis` draws each argument from a pool of plausible values and of bad ones: the wrong kind,
None, NaN and infinities, zero, negatives, integers past int64, empty containers, tensors holding
NaN or nothing, and paths that are missing, folders, links or named with spaces and non-ASCII.
The property (`said_properly`): the call works, or the package itself refuses it, with a `raise`
statement of its own (not a traceback from inside PyTorch, NumPy or Python's arithmetic on a
value of the wrong kind) and a short message that names an argument, the function or the value;
and it never hangs (an alarm ends a call after HANG_S seconds).

In `make test` each function gets a few examples, drawn the same way on every run (derandomised,
so a run cannot fail by chance); `make fuzz` draws many more at random and keeps what it finds in
build/hypothesis. A failing example it finds becomes a case of tests/test_bad_input*.py.
"""

from __future__ import annotations

import inspect
import math
import os
import re
import signal
import traceback
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase
from torch import nn

import d2l_gpu as d2l

HANG_S = 20  # far above the seconds any call with these small values takes
settings.register_profile(
    "make-test",
    max_examples=6,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
settings.register_profile(
    "fuzz",
    max_examples=200,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=DirectoryBasedExampleDatabase(Path(__file__).parent.parent / "build" / "hypothesis"),
)
settings.load_profile(os.environ.get("D2L_GPU_FUZZ", "make-test"))

# The book's names for PyTorch's own functions (d2l.ones is torch.ones): PyTorch's errors are
# their contract, as in the book. Constants and the plotting module are not called.
NOT_OURS = set(d2l._NAMES["book.aliases"]) | {"plt"}
# They start processes or wait for them: called only with values of the wrong kind (below), so
# that a sweep never starts a job. The launchers' good paths are tested in tests/test_jobs.py.
STARTS_PROCESSES = {"launch", "launch_and_kill", "launch_nodes", "run_job", "kill_worker",
                    "run_workers"}  # fmt: skip


class Hang(Exception):
    """A call that did not return within HANG_S seconds."""


def _tiny_net() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2))


def _paths(root: Path) -> list[Path]:
    """Paths of every awkward kind, made under `root`."""
    folder = root / "a folder"
    folder.mkdir(exist_ok=True)
    locked = root / "read-only.pt"
    locked.write_bytes(b"not a checkpoint")
    locked.chmod(0o444)
    dangling = root / "dangling"
    if not dangling.is_symlink():
        dangling.symlink_to(root / "nowhere")
    return [root / "missing" / "x.pt", folder, locked, dangling, root / "ünï cödé.pt"]


def plausible() -> st.SearchStrategy:
    """Values a lesson passes: small counts, rates, the CPU, tiny tensors and a tiny network."""
    return st.one_of(
        st.integers(1, 3),
        st.sampled_from([0.1, 0.5]),
        st.sampled_from(["cpu", torch.device("cpu"), [torch.device("cpu")], (1, 2)]),
        st.builds(lambda: torch.ones(2, 2)),
        st.builds(_tiny_net),
    )


def bad(paths: list[Path]) -> st.SearchStrategy:
    """Values of the wrong kind, out of range, empty, or not there."""
    return st.one_of(
        st.sampled_from([None, "", "text", b"bytes", [], (), {}, object(), True]),
        st.sampled_from([0, -1, 2**64, -(2**63) - 1, 1.5]),
        st.sampled_from([math.nan, math.inf, -math.inf, 1e308 * 10]),
        st.builds(lambda: torch.full((2, 2), math.nan)),
        st.builds(lambda: torch.empty(0)),
        st.builds(lambda: torch.ones(3, dtype=torch.int64)),
        st.sampled_from(paths + [str(p) for p in paths]),
    )


def public_functions() -> list[str]:
    """Every public name of the package that can be called, but PyTorch's own under book names."""
    return sorted(n for n in d2l.__all__ if n not in NOT_OURS and callable(getattr(d2l, n)))


def parameters(fn) -> list[inspect.Parameter]:
    """The parameters a caller may give `fn` by name or position (not *args, **kwargs)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
             inspect.Parameter.KEYWORD_ONLY)  # fmt: skip
    return [p for p in sig.parameters.values() if p.kind in kinds]


def _alarm(signum, frame):
    raise Hang(f"no answer after {HANG_S} s")


def call(fn, args: dict):
    """`fn(**args)` (positional-only ones in order), ended by Hang after HANG_S seconds."""
    params = parameters(fn)
    positional = [args.pop(p.name) for p in params if p.kind == p.POSITIONAL_ONLY if p.name in args]
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    try:
        return fn(*positional, **args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


PACKAGE = str(Path(d2l.__file__).parent)
WORD = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def said_properly(error: BaseException, name: str, args: dict) -> str | None:
    """None if `error` is the package's own refusal of this call; else what is wrong with it."""
    if isinstance(error, Hang):
        return "it hung"
    if not isinstance(error, (TypeError, ValueError, OSError, LookupError, RuntimeError)):
        return f"{type(error).__name__} is not a refusal"
    frames = traceback.extract_tb(error.__traceback__)
    last = frames[-1] if frames else None
    if last is None or not last.filename.startswith(PACKAGE):
        where = last.filename if last else "?"
        return f"raised outside the package, in {where}"
    ours = last.filename.endswith("_typed.py") and "raise sentence" in (last.line or "")
    if not ours and not (last.line or "").lstrip().startswith(f"raise {type(error).__name__}("):
        return f"not a deliberate raise: {last.filename}:{last.lineno}: {last.line}"
    message = str(error)
    if not message or len(message) > 800:
        return "no sentence, or a page of text"
    words = set(WORD.findall(message))
    named = {name, *args} & words or any(repr(v)[:40] in message for v in args.values())
    return None if named else f"names no argument: {message!r}"


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> list[Path]:
    return _paths(tmp_path_factory.mktemp("awkward paths"))


@pytest.fixture(autouse=True)
def _quiet(tmp_path, monkeypatch):
    """Each call runs in its own folder, draws no window and downloads nothing."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("D2L_GPU_LIVE_PLOTS", "0")
    monkeypatch.setenv("D2L_GPU_MIRROR", "http://127.0.0.1:9/")  # refused at once, offline


def test_every_public_function_names_a_misfitting_argument():
    """Every public function, and every public class's own __init__, is wrapped by `typed`
    (d2l_gpu/_typed.py), which each module applies in its last line: one forgotten fails here."""
    bare = []
    for name in public_functions():
        obj = getattr(d2l, name)
        target = vars(obj).get("__init__") if isinstance(obj, type) else obj
        if target is not None and not hasattr(target, "__wrapped__"):
            bare.append(name)
    assert not bare, f"not wrapped (add wrap_public(globals()) to their modules): {bare}"


@pytest.mark.parametrize("name", public_functions())
def test_every_public_function_works_or_refuses_with_a_sentence(name, paths):
    fn = getattr(d2l, name)
    params = parameters(fn)
    required = [p for p in params if p.default is inspect.Parameter.empty]
    optional = [p for p in params if p.default is not inspect.Parameter.empty]
    wrong = bad(paths)
    value = wrong if name in STARTS_PROCESSES else st.one_of(plausible(), wrong)
    problems: list[str] = []

    @given(
        st.fixed_dictionaries({p.name: value for p in required}),
        st.dictionaries(st.sampled_from([p.name for p in optional] or ["-"]), wrong, max_size=1),
    )
    def sweep(given_args, extra):
        args = {**given_args, **{k: v for k, v in extra.items() if k != "-"}}
        if name in STARTS_PROCESSES and not args:
            return
        shown = {k: repr(v)[:60] for k, v in args.items()}
        try:
            call(fn, dict(args))
        except Exception as error:  # noqa: BLE001 - the property reads every error
            wrong_with_it = said_properly(error, name, args)
            if wrong_with_it:
                problems.append(f"{name}({shown}): {type(error).__name__}: {wrong_with_it}")

    sweep()
    assert not problems, "\n".join(dict.fromkeys(problems))
