"""One figure per notebook cell, updated in place: what Animator and ProgressBoard share.

In a Jupyter kernel the first draw displays the figure with a display handle and later draws
update that same output (`display(fig, display_id=True)`, then `handle.update(fig)`), so the
cell's printed lines stay. While a loop runs, redraws are throttled (one per `min_interval`
seconds); a `post_run_cell` callback, registered once per cell, draws the final state when the
cell ends, so a figure never stops short of its last points even if `show()` is never called.
With D2L_GPU_LIVE_PLOTS off the figure is drawn once, when the cell ends (or at `show()`).
Outside a kernel nothing is displayed until `show()`.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

ENV = "D2L_GPU_LIVE_PLOTS"
_CHOICES = {
    "1": True,
    "true": True,
    "on": True,
    "yes": True,
    "0": False,
    "false": False,
    "off": False,
    "no": False,
}


def live_plots_enabled() -> bool:
    """Read D2L_GPU_LIVE_PLOTS (default on): 1/true/on/yes or 0/false/off/no, any case."""
    raw = os.environ.get(ENV)
    if raw is None or not raw.strip():  # unset or empty: the default
        return True
    try:
        return _CHOICES[raw.strip().lower()]
    except KeyError:
        raise ValueError(
            f"{ENV}={raw!r} is not a setting this package understands; set it to one of "
            "0, 1, false, true, off, on, no, yes (any case). On (the default) redraws a "
            "training plot while its cell runs; off draws it once, when the cell ends."
        ) from None


def kernel_shell():
    """The IPython shell when running in a Jupyter kernel, else None."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
        return None
    return shell


class LiveFigure:
    """Show the figure returned by `render()` in the current cell, redrawn in place."""

    def __init__(self, render: Callable, min_interval: float = 0.5):
        self.render, self.min_interval = render, min_interval
        enabled = live_plots_enabled()  # checked even outside a kernel: a typo fails early
        self.shell = kernel_shell()
        self.live = enabled and self.shell is not None
        self.handle = None  # display handle of the figure in the current cell
        self.stale = False  # data changed since the last draw
        self._last = -math.inf  # time of the last draw
        self._hooked = False

    def changed(self) -> None:
        """Note new data: redraw now if live and not drawn recently, else at the end of cell."""
        self.stale = True
        if self.shell is None:
            return
        self._hook()
        if self.live and time.monotonic() - self._last >= self.min_interval:
            self.flush()

    def flush(self) -> None:
        """Draw now and display: a new output the first time in a cell, then the same one."""
        fig = self.render()
        self.stale = False
        self._last = time.monotonic()
        from IPython import display

        if self.handle is None:
            self.handle = display.display(fig, display_id=True)
        else:
            self.handle.update(fig)

    def show(self) -> None:
        """Draw the current state now; display it if there is an IPython shell."""
        if self.shell is not None:
            self._hook()
            self.flush()
            return
        fig = self.render()
        self.stale = False
        try:
            from IPython import display, get_ipython
        except ImportError:
            return
        if get_ipython() is not None:  # a terminal IPython: prints the figure's repr
            display.display(fig)

    def _hook(self) -> None:
        if not self._hooked:
            self.shell.events.register("post_run_cell", self._end_of_cell)
            self._hooked = True

    def _end_of_cell(self, result=None) -> None:
        """post_run_cell callback: draw what the cell added last, then forget the cell."""
        self.shell.events.unregister("post_run_cell", self._end_of_cell)
        self._hooked = False
        try:
            if self.stale:
                self.flush()
        finally:
            self.handle = None  # the next cell that adds points shows its own figure
