"""Run several nbgrader commands in one Python process: `python nbgrader_batch.py < commands.json`.

The input is a JSON list of [folder, [argument, ...]]: each command is what `nbgrader ARGS` does
when run in that folder (the same application classes, the folder's nbgrader_config.py read
again). One process instead of one per command: each start of nbgrader costs about 3 seconds of
imports here, and tests/test_grading.py's loop runs 14 commands. Exits 1 with the output of the
first command that failed; nothing after it runs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys

from jupyter_core.application import NoStart
from jupyter_core.utils import ensure_event_loop
from nbgrader.apps.nbgraderapp import NbGraderApp
from traitlets.config import SingletonConfigurable


def _singletons(cls: type = SingletonConfigurable) -> list[type]:
    """Every loaded subclass of `cls`: the applications a command made into singletons."""
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_singletons(sub)]
    return found


def run(folder: str, args: list[str]) -> tuple[int, str]:
    """One command as `nbgrader ARGS` in `folder`: (its exit status, what it printed or logged)."""
    for cls in _singletons():
        cls.clear_instance()  # a fresh application each time, as in a new process
    said, status = io.StringIO(), 0
    os.chdir(folder)
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        try:
            app = NbGraderApp.instance()
            app.initialize(args)  # its log goes to the stderr of this moment: `said`
            app.start()
        except NoStart:  # how a Jupyter application says that its subcommand is done
            pass
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else 1
    return status, said.getvalue()


def main() -> int:
    ensure_event_loop()  # as `nbgrader` does before anything else
    for folder, args in json.load(sys.stdin):
        status, said = run(folder, args)
        print(f"=== nbgrader {' '.join(args)} (in {folder}): exit {status}\n{said}", flush=True)
        if status:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
