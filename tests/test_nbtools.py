"""Tests of scripts/nbtools.py on files that are not notebooks in shape, and on a failed write."""

import json
import os
import subprocess
import sys

import nbtools
import pytest
from conftest import ROOT


def messy_notebook() -> dict:
    """A valid notebook that tidy changes (old minor version, no ids), with a sizeable output."""
    output = {"output_type": "stream", "name": "stdout", "text": ["line\n"] * 200}
    return {
        "nbformat": 4,
        "nbformat_minor": 4,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
        "cells": [
            {
                "cell_type": "markdown",
                "source": "# Title",
                "metadata": {"slideshow": {"slide_type": "slide"}},
            },
            {
                "cell_type": "code",
                "source": "print('line')",
                "metadata": {"slideshow": {"slide_type": "-"}},
                "execution_count": 1,
                "outputs": [output],
            },
        ],
    }


def broken(change) -> dict:
    nb = messy_notebook()
    change(nb)
    return nb


MALFORMED = {  # file name -> (its JSON, what the report must say)
    "list": ([], "not a notebook: the file holds a list, not a JSON object"),
    "string-cell": (
        broken(lambda nb: nb["cells"].append("print(1)")),
        "cell 2 is a string, not an object",
    ),
    "metadata-list": (
        broken(lambda nb: nb.update(metadata=[])),
        "metadata is a list, not an object",
    ),
    "cell-metadata-string": (
        broken(lambda nb: nb["cells"][0].update(metadata="slide")),
        "cell 0: metadata is a string, not an object",
    ),
    "slideshow-string": (
        broken(lambda nb: nb["cells"][1]["metadata"].update(slideshow="-")),
        "cell 1: metadata.slideshow is a string, not an object",
    ),
    "language-info-number": (
        broken(lambda nb: nb["metadata"].update(language_info=3)),
        "metadata.language_info is a number, not an object",
    ),
    "cells-null": (broken(lambda nb: nb.update(cells=None)), "cells is null, not a list"),
    "no-cells": (broken(lambda nb: nb.pop("cells")), "no 'cells'"),
    "id-list": (
        broken(lambda nb: nb["cells"][0].update(id=[])),
        "cell 0: id is a list, not a string",
    ),
    "source-numbers": (
        broken(lambda nb: nb["cells"][0].update(source=[1, 2])),
        "cell 0: an item of source is a number, not a string",
    ),
    "output-string": (
        broken(lambda nb: nb["cells"][1].update(outputs=["x"])),
        "cell 1: an item of outputs is a string, not an object",
    ),
}


@pytest.fixture
def files(tmp_path):
    """The malformed notebooks, then a good one last: (path, expected problem or None)."""
    written = []
    for name, (nb, expected) in MALFORMED.items():
        path = tmp_path / f"{name}.ipynb"
        path.write_text(json.dumps(nb))
        written.append((path, expected))
    good = tmp_path / "zz-good.ipynb"
    good.write_text(nbtools.dumps(nbtools.tidy(messy_notebook())))
    return [*written, (good, None)]


def test_check_reports_each_malformed_file_and_goes_on(files, capsys):
    assert nbtools.main(["check", *(str(path) for path, _ in files)]) == 1
    out = capsys.readouterr().out
    for path, expected in files[:-1]:
        assert f"{path}: {expected}" in out
    assert str(files[-1][0]) not in out  # the good file, checked after all the bad ones
    assert out.strip().endswith(f"1/{len(files)} notebooks clean")


def test_tidy_refuses_malformed_files_and_goes_on(files, capsys):
    before = {path: path.read_bytes() for path, _ in files}
    good = files[-1][0]
    good.write_text(json.dumps(messy_notebook()))  # untidy, so that tidy rewrites it
    assert nbtools.main(["tidy", *(str(path) for path, _ in files)]) == 1
    out = capsys.readouterr().out
    for path, expected in files[:-1]:
        assert f"not tidied: {path}: " in out and expected in out
        assert path.read_bytes() == before[path]
    assert f"tidied: {good}" in out and nbtools.check_file(good) == []


FSIZE_LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
import nbtools
sys.exit(nbtools.main(["tidy", sys.argv[2]]))
"""


def test_failed_tidy_write_leaves_the_notebook_intact(tmp_path):
    path = tmp_path / "lesson.ipynb"
    path.write_text(json.dumps(messy_notebook()))
    before = path.read_bytes()
    tidied = nbtools.dumps(nbtools.tidy(messy_notebook()))
    assert len(tidied) > 2000  # the file-size limit below
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'scripts'}",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", FSIZE_LIMITED, "2000", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert f"not tidied: {path}: cannot write it (File too large); it is unchanged" in done.stdout
    assert "Traceback" not in done.stderr
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.skipif(os.name == "nt", reason="POSIX links")
def test_tidy_through_a_link_tidies_the_notebook_and_keeps_the_link(tmp_path):
    """Issue 46: the atomic write renamed over the link, leaving the real notebook untidied."""
    real = tmp_path / "real.ipynb"
    real.write_text(json.dumps(messy_notebook()))
    link = tmp_path / "link.ipynb"
    link.symlink_to(real.name)
    assert nbtools.tidy_file(link)
    assert link.is_symlink() and os.readlink(link) == real.name
    assert real.read_text() == nbtools.dumps(nbtools.tidy(messy_notebook()))
