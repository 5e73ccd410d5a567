"""Plotting with the book's helpers: set_figsize, plot, show_images, Animator (ProgressBoard, the
book's board for its Trainer, lives in d2l_gpu.book.board)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from . import _checks
from ._live import LiveFigure
from ._typed import wrap_public


def pyplot():
    """matplotlib.pyplot, imported on first use (so `import d2l_gpu` stays light)."""
    import matplotlib.pyplot as plt

    return plt


def __getattr__(name: str):
    """`d2l.plt` is matplotlib.pyplot, imported the first time it is asked for."""
    if name == "plt":
        return pyplot()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def set_figsize(figsize: tuple[float, float] = (3.5, 2.5)) -> None:
    """Set the figure size for matplotlib."""
    pyplot().rcParams["figure.figsize"] = figsize


def set_axes(axes, xlabel, ylabel, xlim, ylim, xscale, yscale, legend) -> None:
    """Set the axes for matplotlib."""
    if not hasattr(axes, "set_xscale"):
        raise TypeError(f"set_axes: axes must be matplotlib's Axes (plt.gca()), got {axes!r:.60}")
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_xscale(xscale)
    axes.set_yscale(yscale)
    axes.set_xlim(xlim)
    axes.set_ylim(ylim)
    if legend:
        axes.legend(legend)
    axes.grid(True)


def _has_one_axis(X) -> bool:
    """True if X is a flat list or 1-d tensor rather than a list of series."""
    return (hasattr(X, "ndim") and X.ndim == 1) or (
        isinstance(X, (list, tuple)) and not hasattr(X[0], "__len__")
    )


SCALES = ("linear", "log", "symlog", "logit")  # matplotlib's axis scales


def _numbers(name: str, i: int, values) -> None:
    """Refuse series `i` of `name` unless matplotlib can read it as numbers."""
    import numpy as np

    if hasattr(values, "detach"):  # a tensor: numbers by construction
        return
    try:
        np.asarray(values, dtype=float)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must hold numbers, but its series {i} does not ({e})") from None


def plot(
    X,
    Y=None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    legend: Sequence[str] = (),
    xlim: tuple[float, float] | None = None,
    ylim: tuple[float, float] | None = None,
    xscale: str = "linear",
    yscale: str = "linear",
    fmts: Sequence[str] = ("-", "m--", "g-.", "r:"),
    figsize: tuple[float, float] = (3.5, 2.5),
    axes=None,
):
    """Plot data points."""
    for name, value in (("X", X), ("Y", Y)):
        if (value is not None or name == "X") and not (
            isinstance(value, (list, tuple)) or hasattr(value, "ndim")
        ):
            raise TypeError(f"plot: {name} must be a tensor, an array or a list, got {value!r:.60}")
        if value is not None and (getattr(value, "ndim", 1) == 0 or len(value) == 0):
            raise ValueError(f"plot: {name} is empty or one number; give it the points to draw")
    for name, scale in (("xscale", xscale), ("yscale", yscale)):
        if scale not in SCALES:
            raise ValueError(f"plot: {name} must be one of {', '.join(SCALES)}, got {scale!r:.60}")
    if axes is not None and not hasattr(axes, "cla"):
        raise TypeError(
            f"plot: axes must be matplotlib's Axes (plt.gca()) or None, got {axes!r:.60}"
        )
    if _has_one_axis(X):
        X = [X]
    if Y is None:
        X, Y = [[]] * len(X), X
    elif _has_one_axis(Y):
        Y = [Y]
    if len(X) != len(Y):
        X = X * len(Y)
    for name, series in (("X", X), ("Y", Y)):
        for i, values in enumerate(series):
            _numbers(f"plot: {name}", i, values)
    if axes is None:
        set_figsize(figsize)
        axes = pyplot().gca()
    axes.cla()
    for i, (x, y, fmt) in enumerate(zip(X, Y, fmts, strict=False)):
        try:
            axes.plot(x, y, fmt) if len(x) else axes.plot(y, fmt)
        except ValueError as e:  # matplotlib's: a format it cannot read, x and y of two lengths
            said = f"plot: series {i} with format {fmt!r:.40} cannot be drawn: {e}"
            raise ValueError(said) from None
    set_axes(axes, xlabel, ylabel, xlim, ylim, xscale, yscale, legend)
    return axes


def bars(
    labels: Sequence[str],
    values,
    ylabel: str,
    title: str | None = None,
    *,
    colors: Sequence[str] | None = None,
    yscale: str = "linear",
    note: str | None = None,
    axes=None,
):
    """Draw a bar chart: one bar per label, or, when `values` is a dict {series: numbers}, one
    group of bars per label with a legend; `note` goes in the top-left corner.

    Shown in lesson 8.
    """
    series = values if isinstance(values, dict) else {None: values}
    if not labels or any(len(v) != len(labels) for v in series.values()):
        raise ValueError(f"bars: every series needs one value per label ({len(labels)} labels)")
    for i, v in enumerate(series.values()):
        _numbers("bars: values", i, v)
    if yscale not in SCALES:
        raise ValueError(f"bars: yscale must be one of {', '.join(SCALES)}, got {yscale!r:.60}")
    axes = axes if axes is not None else pyplot().subplots(figsize=(6, 3.2))[1]
    width = 0.8 / len(series)
    for j, (name, v) in enumerate(series.items()):
        if name is None:
            axes.bar(list(labels), list(v), color=colors)
        else:
            xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(labels))]
            axes.bar(xs, list(v), width, label=name)
    if len(series) > 1 or None not in series:
        axes.set_xticks(range(len(labels)), list(labels))
        axes.legend(fontsize=8, loc="upper right")
    axes.set_yscale(yscale)
    axes.set_ylabel(ylabel)
    if yscale == "linear":  # room above the bars for the legend or the note
        axes.set_ylim(0, max(max(v) for v in series.values()) * 1.3)
    if note:
        axes.text(0.02, 0.97, note, transform=axes.transAxes, ha="left", va="top", fontsize=8)
    if title:
        axes.set_title(title, fontsize="small")
    return axes


def show_images(imgs: Iterable, num_rows: int, num_cols: int, titles=None, scale: float = 1.5):
    """Plot a list of images."""
    _checks.whole("show_images: num_rows", num_rows, most=1000)
    _checks.whole("show_images: num_cols", num_cols, most=1000)
    figsize = (num_cols * scale, num_rows * scale)
    _, axes = pyplot().subplots(num_rows, num_cols, figsize=figsize, squeeze=False)
    axes = axes.flatten()
    for i, (ax, img) in enumerate(zip(axes, imgs, strict=False)):
        img = img.detach().cpu().numpy() if hasattr(img, "detach") else img
        if not hasattr(img, "squeeze") or img.squeeze().ndim not in (2, 3):
            raise ValueError(
                f"show_images: image {i} is not a picture (2 or 3 dims), got {img!r:.50}"
            )
        ax.imshow(img.squeeze(), cmap="gray")
        ax.axes.get_xaxis().set_visible(False)
        ax.axes.get_yaxis().set_visible(False)
        if titles:
            ax.set_title(titles[i])
    return axes


class Animator:
    """For plotting data in animation: one figure per cell, redrawn in place, complete at the end.

    In a notebook, redraws are throttled to one per `min_interval` seconds while a loop runs and
    the final state is drawn when the cell ends, so `show()` is optional (see d2l_gpu._live).
    Shown in lesson 5.
    """

    def __init__(
        self,
        xlabel: str | None = None,
        ylabel: str | None = None,
        legend: Sequence[str] | None = None,
        xlim: tuple[float, float] | None = None,
        ylim: tuple[float, float] | None = None,
        xscale: str = "linear",
        yscale: str = "linear",
        fmts: Sequence[str] = ("-", "m--", "g-.", "r:"),
        nrows: int = 1,
        ncols: int = 1,
        figsize: tuple[float, float] = (3.5, 2.5),
        title: str | None = None,
        min_interval: float = 0.5,
    ):
        _checks.whole("Animator: nrows", nrows)
        _checks.whole("Animator: ncols", ncols)
        legend = legend or []
        plt = pyplot()
        self.fig, self.axes = plt.subplots(nrows, ncols, figsize=figsize)
        plt.close(self.fig)  # shown only through the display handle, never twice by inline
        if nrows * ncols == 1:
            self.axes = [self.axes]
        self.config_axes = lambda: set_axes(
            self.axes[0], xlabel, ylabel, xlim, ylim, xscale, yscale, legend
        )
        self.title, self.fmts = title, fmts
        self.X: list[list] | None = None  # one list of x values per series, from the first add
        self.Y: list[list] | None = None
        self._view = LiveFigure(self._render, min_interval)
        self.live = self._view.live

    def add(self, x, y) -> None:
        """Add multiple data points into the figure (a None in y skips that series)."""
        if not hasattr(y, "__len__"):
            y = [y]
        n = len(y)
        if not hasattr(x, "__len__"):
            x = [x] * n
        if not self.X:
            self.X = [[] for _ in range(n)]
        if not self.Y:
            self.Y = [[] for _ in range(n)]
        for i, (a, b) in enumerate(zip(x, y, strict=False)):
            if a is not None and b is not None:
                self.X[i].append(a)
                self.Y[i].append(b)
        self._view.changed()

    def draw(self) -> None:
        """Redraw every series on the axes."""
        self.axes[0].cla()
        for x, y, fmt in zip(self.X or [], self.Y or [], self.fmts, strict=False):
            self.axes[0].plot(x, y, fmt)
        self.config_axes()
        if self.title:
            self.axes[0].set_title(self.title, fontsize="small")

    def _render(self):
        self.draw()
        return self.fig

    def show(self) -> None:
        """Draw the figure now (in a notebook: display it, or update the one shown)."""
        self._view.show()


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
