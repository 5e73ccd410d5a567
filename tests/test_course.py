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


def test_test_runs_the_unit_tests_and_every_notebook_in_one_run_on_every_core(capsys, tmp_path):
    (tmp_path / "bin").mkdir()
    for stamp in (".installed", ".installed-dev"):
        (tmp_path / stamp).touch()
    course.venv_python(tmp_path).touch()  # an environment that exists and is up to date
    assert course.Course(tmp_path, dry_run=True).test() is None
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2, printed  # nothing installed again
    assert printed[1].endswith("-m pytest -q -m solo tests")  # alone, after the others
    words = printed[0].split()
    assert words[words.index("-n") + 1] == str(course.workers())
    assert "--dist loadfile" in printed[0] and "-m not cluster and not solo" in printed[0]
    assert words[-1] == "tests"
    shown = set(words)
    for nb in [*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("solutions/*.ipynb")]:
        assert nb.relative_to(ROOT).as_posix() in shown
    notebooks = [w for w in words if w.endswith(".ipynb")]
    assert notebooks[: len(course.LONGEST_FIRST)] == list(course.LONGEST_FIRST)
    assert len(notebooks) == len(set(notebooks))  # each notebook once


def test_the_longest_first_are_notebooks_that_exist():
    assert set(course.LONGEST_FIRST) <= set(course.notebooks())


def test_workers_use_each_core_once():
    assert [course.workers(n) for n in (1, 2, 3, 8, 64)] == [1, 2, 3, 4, 4]
    assert course.parallel_env(2)["OMP_NUM_THREADS"] == "1"
    assert course.parallel_env(8)["OMP_NUM_THREADS"] == "2"  # 4 workers of 2 threads
    assert course.parallel_env(1)["OMP_NUM_THREADS"] == "1"


def test_an_older_cpu_is_one_step_below_this_one():
    avx512 = course.other_cpu_env({"avx2", "avx512f"})
    assert avx512["ATEN_CPU_CAPABILITY"] == "avx2" and avx512["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    avx2 = course.other_cpu_env({"avx2", "fma"})
    assert avx2["ATEN_CPU_CAPABILITY"] == "default" and avx2["MKL_ENABLE_INSTRUCTIONS"] == "SSE4_2"
    assert avx512["OMP_NUM_THREADS"] == avx2["OMP_NUM_THREADS"] == "1"


def test_other_cpu_and_slow_together_run_every_notebook_once_with_older_kernels(
    monkeypatch, tmp_path, capsys
):
    runs = []
    monkeypatch.setattr(course, "_cpu_flags", lambda: {"avx512f"})
    monkeypatch.setattr(course.Course, "setup_dev", lambda self: None)
    monkeypatch.setattr(course.Course, "run", lambda self, *cmd, env=None: runs.append((cmd, env)))
    c = course.Course(tmp_path)
    c.test_other_cpu()
    c.test_slow()
    assert [env["ATEN_CPU_CAPABILITY"] for _, env in runs] == ["avx2", "avx2", "avx2"]
    shown = [w for cmd, _ in runs for w in cmd if w.endswith(".ipynb")]
    assert sorted(shown) == sorted(course.notebooks())  # each once, between the two
    assert "tests" in runs[0][0] and "ATEN_CPU_CAPABILITY=avx2" in capsys.readouterr().out


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


def test_the_lessons_of_the_edition_d2l_gpu_lang_names(monkeypatch, capsys):
    monkeypatch.setenv("D2L_GPU_LANG", "zh")
    assert course.main(["lessons", "--dry-run"]) == 0
    assert "run_lessons.py --markdown --lang zh" in capsys.readouterr().out
    monkeypatch.setenv("D2L_GPU_LANG", "vi")
    assert course.main(["lessons", "--dry-run"]) == 0
    assert "run_lessons.py --markdown --lang vi" in capsys.readouterr().out
    monkeypatch.setenv("D2L_GPU_LANG", "fr")
    assert course.main(["lab", "--dry-run"]) == 1
    said = capsys.readouterr()
    assert "course.py lab: D2L_GPU_LANG=fr: the lessons exist in en, zh, vi" in said.err
    assert "pip install" not in said.out  # said before anything is installed


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
    assert "torch-directml` 0.2.5.dev240914" in (ROOT / "docs" / "setup.md").read_text()
