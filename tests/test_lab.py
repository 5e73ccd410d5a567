"""`make lab` (scripts/lab.py) serves the lessons: every diagram loads, curves are live."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import nbtools
import pytest
from conftest import free_port
from lab import edition, lab_command, lab_env

ROOT = Path(__file__).resolve().parent.parent
IMG_LINK = re.compile(r"""(?:\]\(|src=["'])\.\./(img/[^)"'\s]+\.svg)""")


def linked_images() -> set[str]:
    """Every ../img/*.svg that a lesson's markdown links to, relative to the project folder."""
    return {
        link
        for path in (ROOT / "notebooks").glob("*.ipynb")
        for c in nbtools.load(path)["cells"]
        if c["cell_type"] == "markdown"
        for link in IMG_LINK.findall(nbtools._source(c))
    }


@contextlib.contextmanager
def serving(cmd: list[str], port: int, token: str, tmp: Path):
    env = lab_env() | {
        "JUPYTER_RUNTIME_DIR": str(tmp / "rt"),
        "JUPYTER_CONFIG_DIR": str(tmp / "cf"),
    }
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, f"JupyterLab exited with {proc.returncode}"
            try:
                urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/api/status?token={token}", timeout=5
                )
                break
            except OSError:
                assert time.monotonic() < deadline, "JupyterLab did not start within 90 s"
                time.sleep(0.3)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def status(port: int, token: str, path: str) -> int:
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/{path}?token={token}", timeout=10
        ) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_lab_command_serves_the_project_folder_with_live_plots():
    cmd = lab_command(ROOT)
    assert f"--ServerApp.root_dir={ROOT}" in cmd
    assert "--LabApp.default_url=/lab/tree/notebooks" in cmd
    assert ("--allow-root" in cmd) == (os.geteuid() == 0)
    assert lab_env({"D2L_GPU_LIVE_PLOTS": "0"})["D2L_GPU_LIVE_PLOTS"] == "1"


def test_the_chinese_lessons_open_when_d2l_gpu_lang_says_zh():
    assert "--LabApp.default_url=/lab/tree/notebooks/zh" in lab_command(ROOT, lang="zh")
    assert (ROOT / "notebooks" / "zh" / "01-devices.ipynb").is_file()  # what it opens on
    assert edition({}) == "en" and edition({"D2L_GPU_LANG": "zh"}) == "zh"
    assert edition({"D2L_GPU_LANG": "vi"}) == "vi"
    with pytest.raises(ValueError, match="D2L_GPU_LANG=fr: the lessons exist in en, zh, vi"):
        edition({"D2L_GPU_LANG": "fr"})


def test_every_diagram_loads_in_make_lab(tmp_path):
    images = linked_images()
    assert len(images) >= 10
    port, token = free_port(), uuid.uuid4().hex
    options = ["--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}"]
    options += [f"--IdentityProvider.token={token}", "--ServerApp.port_retries=0"]
    with serving(lab_command(ROOT, *options), port, token, tmp_path):
        missing = [img for img in sorted(images) if status(port, token, f"files/{img}") != 200]
        assert status(port, token, "api/contents/notebooks/01-devices.ipynb") == 200
    assert not missing, f"diagrams that answer no 200 in make lab: {missing}"


@pytest.mark.parametrize("served", ["notebooks"])
def test_serving_notebooks_alone_breaks_the_diagrams(tmp_path, served):
    """Negative control: the old `jupyter lab notebooks` root, where ../img lies outside it."""
    port, token = free_port(), uuid.uuid4().hex
    cmd = lab_command(ROOT / served, "--no-browser", "--ServerApp.ip=127.0.0.1")
    cmd += [f"--ServerApp.port={port}", f"--IdentityProvider.token={token}"]
    with serving(cmd, port, token, tmp_path):
        assert status(port, token, f"files/{sorted(linked_images())[0]}") == 404
