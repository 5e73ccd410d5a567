"""JupyterLab on the lessons, as `make lab` starts it and as the browser test serves them.

    python scripts/lab.py [--port N] [JUPYTERLAB OPTIONS ...]
    D2L_GPU_LANG=zh python scripts/lab.py      # the file browser on the Chinese lessons (vi:
                                               # the Vietnamese ones translated so far)

The server's root is the project folder (not notebooks/), so that the lessons' diagrams, linked as
`../img/*.svg`, load; the file browser opens in notebooks/. Training curves redraw live
(D2L_GPU_LIVE_PLOTS=1: a person is watching). As root (a container, a VM) JupyterLab refuses to
start unless told `--allow-root`: this script passes it and says so.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LESSONS = {"en": "notebooks", "zh": "notebooks/zh", "vi": "notebooks/vi"}  # by D2L_GPU_LANG


def edition(env: dict | None = None) -> str:
    """The edition D2L_GPU_LANG names ("en" where unset), or ValueError in a sentence."""
    lang = (os.environ if env is None else env).get("D2L_GPU_LANG", "").strip() or "en"
    if lang not in LESSONS:
        raise ValueError(
            f"D2L_GPU_LANG={lang}: the lessons exist in {', '.join(LESSONS)}; set it to one of "
            "them (zh: the Chinese lessons; vi: the Vietnamese ones translated so far), or leave "
            "it unset for English"
        )
    return lang


def lab_command(root: Path, *options: str, lang: str = "en") -> list[str]:
    """The command that serves the project folder `root` (notebooks/ and img/ inside it), its
    file browser open on the lessons of the edition `lang` (zh: notebooks/zh/)."""
    cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={Path(root).resolve()}"]
    cmd += [f"--LabApp.default_url=/lab/tree/{LESSONS[lang]}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    return cmd + list(options)


def lab_env(env: dict | None = None) -> dict:
    """The environment of the server and its kernels: live plots, d2l_gpu from this checkout."""
    env = dict(os.environ if env is None else env)
    env["D2L_GPU_LIVE_PLOTS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def main(argv: list[str] | None = None) -> int:
    try:
        lang = edition()
    except ValueError as e:
        print(f"lab: {e}", file=sys.stderr)
        return 2
    cmd = lab_command(ROOT, *(sys.argv[1:] if argv is None else argv), lang=lang)
    if "--allow-root" in cmd:
        print("lab: running as root, so JupyterLab is started with --allow-root", file=sys.stderr)
    os.execve(cmd[0], cmd, lab_env())  # JupyterLab takes over this process (Ctrl-C stops it)
    return 0


if __name__ == "__main__":
    sys.exit(main())
