"""Every flag of the training script and the course's scripts, given values nobody thought of.

The companion of tests/test_sweep_functions.py (issue 46), with the same profiles: a few
derandomised examples per flag in `make test`, many random ones in `make fuzz`. The property:
the command works, or it exits 2 with a short message that names the flag (or the value) and
no traceback; and it ends within HANG_S seconds. The training script runs in this interpreter as
a lone rank on the small data set (a value it accepts trains 32 examples for one epoch); the
scripts' own `main` runs here too, given only values that no flag of theirs may accept, and is
stopped once its parser has taken the command line: none of them ever starts its real work.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_sweep_functions import Hang, _paths, call

from d2l_gpu import torchrun, train
from d2l_gpu.train.config import TrainConfig, _flag

BASE = ["--model", "lenet", "--epochs", "1", "--batch-size", "16", "--limit", "32"]
# text that no number flag may take: empty, a word, NaN, infinities, negatives, past int64
NOT_A_COUNT = ["", "abc", "nan", "inf", "-inf", "-1", "1e999", "18446744073709551616", "ü"]
TRAIN_FLAGS = sorted(_flag(f.name) for f in fields(TrainConfig))


def texts(paths: list[Path]) -> st.SearchStrategy:
    """Command-line values: numbers bad and good, words, and every awkward kind of path."""
    numbers = ["0", "1", "2", "0.5", "1e-300", "2.5", "-0"]
    return st.sampled_from(NOT_A_COUNT + numbers + [str(p) for p in paths])


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> list[Path]:
    return _paths(tmp_path_factory.mktemp("awkward paths"))


def said_once(status, err: str, flag: str, value: str) -> str | None:
    """None if the run ended as the property asks; else what is wrong with how it ended."""
    if status == 0:
        return None
    if status != 2:
        return f"exit status {status!r}"
    if "Traceback" in err:
        return "a traceback"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if not lines or len(lines[-1]) > 800:
        return f"no sentence: {err[-300:]!r}"
    said = lines[-1]
    return None if (flag in said or (value and value in said)) else f"names no flag: {said!r}"


@pytest.mark.parametrize("flag", TRAIN_FLAGS)
def test_every_training_flag_works_or_is_refused_in_a_sentence(
    flag, paths, lone, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # a checkpoint or a --save that a value allows lands here
    problems: list[str] = []

    @given(texts(paths))
    def sweep(value):
        argv = [*BASE, f"--{flag}", value] if not flag.startswith(("sync-bn", "progress")) else [
            *BASE, f"--{flag}={value}"]  # fmt: skip
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                status = call(train.main, {"argv": argv})
        except SystemExit as e:
            status = e.code
        except Hang:
            status = "a hang"
        except Exception as e:  # noqa: BLE001 - the property reads every error
            status = f"{type(e).__name__}: {e}"
        wrong = said_once(status, err.getvalue(), f"--{flag}", value)
        if wrong:
            problems.append(f"--{flag} {value!r}: {wrong}")

    sweep()
    assert not problems, "\n".join(dict.fromkeys(problems))


# script -> its flags that take a number: none of them may take NOT_A_COUNT's values
SCRIPT_FLAGS = {
    "gpu_report": ["--epochs", "--limit", "--timeout"],
    "netns_link": ["--rate-mbit", "--delay-ms", "--size-kb", "--rounds", "--timeout"],
    "run_lessons": ["--timeout"],
    "stress_ddp": ["--jobs", "--parallel", "--timeout"],
}


class Parsed(Exception):
    """The script's parser took the command line: it would now start its work."""


@pytest.mark.parametrize("script", sorted(SCRIPT_FLAGS))
def test_every_number_flag_of_the_scripts_refuses_what_is_not_a_count(script, monkeypatch):
    """Each script's own main(argv), in this interpreter, stopped right after its parser took
    the command line: a value it should refuse is seen as Parsed, and no work ever starts."""
    module = importlib.import_module(script)
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        parse(self, args, namespace)
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    problems: list[str] = []

    @given(st.sampled_from(SCRIPT_FLAGS[script]), st.sampled_from(NOT_A_COUNT))
    def sweep(flag, value):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                module.main([f"{flag}={value}"])
        except Parsed:
            problems.append(f"{script}.py {flag}={value!r}: taken, and its work would start")
            return
        except SystemExit as e:
            wrong = said_once(e.code, err.getvalue(), flag, value)
            if wrong:
                problems.append(f"{script}.py {flag}={value!r}: {wrong}")
            return
        problems.append(f"{script}.py {flag}={value!r}: main returned without parsing")

    sweep()
    assert not problems, "\n".join(dict.fromkeys(problems))


def test_the_private_torchruns_worker_count_refuses_what_is_not_a_count():
    """`python -m d2l_gpu.torchrun --nproc-per-node X`: torchrun itself answered `abc`, 0 and -1
    with a traceback, and 2**64 with no answer at all; the other flags are torchrun's own."""
    problems: list[str] = []

    @given(st.sampled_from(NOT_A_COUNT + ["0", "4097"]), st.booleans())
    def sweep(value, joined):
        count = [f"--nproc-per-node={value}"] if joined else ["--nproc-per-node", value]
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            status = torchrun.main([*count, "-m", "d2l_gpu.train"])  # refused: nothing starts
        wrong = said_once(status, err.getvalue(), "--nproc-per-node", value)
        if wrong or status != 2:
            problems.append(f"--nproc-per-node {value!r}: {wrong or 'taken'}")

    sweep()
    assert not problems, "\n".join(dict.fromkeys(problems))
