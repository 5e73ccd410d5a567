"""scripts/course.py: the course's commands without make, on every platform."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import course
import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_venv_python_on_windows_and_elsewhere():
    venv = Path("v")
    assert course.venv_python(venv, windows=True) == venv / "Scripts" / "python.exe"
    assert course.venv_python(venv, windows=False) == venv / "bin" / "python"


def test_every_make_target_but_lock_calls_course_py():
    text = (ROOT / "Makefile").read_text()
    targets = re.findall(r"^([a-z0-9-]+):", text, flags=re.M)
    for target in set(targets) - {"lock"}:
        assert target in course.COMMANDS, f"course.py has no command {target}"
        body = text.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]
        assert f"$(COURSE) {target}" in body, f"make {target} does not call course.py {target}"


def test_test_runs_the_unit_tests_then_every_notebook_and_solution(capsys, tmp_path):
    (tmp_path / "bin").mkdir()
    for stamp in (".installed", ".installed-dev"):
        (tmp_path / stamp).touch()
    course.venv_python(tmp_path).touch()  # an environment that exists and is up to date
    assert course.Course(tmp_path, dry_run=True).test() is None
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2, printed  # nothing installed again
    assert printed[0].endswith("-m pytest -m not cluster tests")
    shown = set(printed[1].split())
    for nb in [*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("solutions/*.ipynb")]:
        assert nb.relative_to(ROOT).as_posix() in shown


def test_a_stale_lock_is_installed_again(tmp_path, capsys):
    course.venv_python(tmp_path).parent.mkdir(parents=True)
    course.venv_python(tmp_path).touch()
    (tmp_path / ".installed").touch()
    old = (ROOT / "requirements.txt").stat().st_mtime - 3600  # however old the checkout is
    os.utime(tmp_path / ".installed", (old, old))
    course.Course(tmp_path, dry_run=True).setup()
    assert "install --quiet -r requirements.txt" in capsys.readouterr().out


def test_a_failing_command_is_one_sentence_and_exit_1(monkeypatch, capsys):
    def fail(self):
        self.run(sys.executable, "-c", "import sys; sys.exit(3)")

    monkeypatch.setattr(course.Course, "clean", fail)
    assert course.main(["clean"]) == 1
    said = capsys.readouterr().err.strip()
    assert said.startswith("course.py clean: `") and said.endswith("exited with 3")


@pytest.mark.parametrize("argv", [[], ["bogus"], ["test", "lessons"]])
def test_a_wrong_command_is_refused_naming_the_choices(argv, capsys):
    assert course.main(argv) == 2
    said = capsys.readouterr().err
    assert "give one command of: setup, setup-dev, lessons" in said


def test_directml_environment_follows_the_lock_and_torch_directml():
    """environment-directml.yml: torch-directml's pins, the lock's jupyterlab, no global --pre."""
    env = (ROOT / "environment-directml.yml").read_text()
    jupyterlab = re.search(r"^jupyterlab==(\S+)", (ROOT / "requirements.txt").read_text(), re.M)
    assert f"jupyterlab=={jupyterlab[1]}" in env
    for pin in ("torch==2.4.1", "torchvision==0.19.1", "torch-directml==0.2.5.dev240914"):
        assert pin in env
    assert not re.search(r"^\s*- --pre\s*$", env, re.M)  # it would admit every pre-release
    assert "torch-directml` 0.2.5.dev240914" in (ROOT / "README.md").read_text()
