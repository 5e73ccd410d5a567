"""Plotting with the book's helpers: set_figsize, plot, show_images, Animator (ProgressBoard, the
book's board for its Trainer, lives in d2l_gpu.book.board)."""

from __future__ import annotations

from ._live import LiveFigure


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
        isinstance(X, list) and not hasattr(X[0], "__len__")
    )


def plot(
    X,
    Y=None,
    xlabel=None,
    ylabel=None,
    legend=(),
    xlim=None,
    ylim=None,
    xscale="linear",
    yscale="linear",
    fmts=("-", "m--", "g-.", "r:"),
    figsize=(3.5, 2.5),
    axes=None,
):
    """Plot data points."""
    if _has_one_axis(X):
        X = [X]
    if Y is None:
        X, Y = [[]] * len(X), X
    elif _has_one_axis(Y):
        Y = [Y]
    if len(X) != len(Y):
        X = X * len(Y)
    if axes is None:
        set_figsize(figsize)
        axes = pyplot().gca()
    axes.cla()
    for x, y, fmt in zip(X, Y, fmts, strict=False):
        axes.plot(x, y, fmt) if len(x) else axes.plot(y, fmt)
    set_axes(axes, xlabel, ylabel, xlim, ylim, xscale, yscale, legend)
    return axes


def show_images(imgs, num_rows: int, num_cols: int, titles=None, scale: float = 1.5):
    """Plot a list of images."""
    figsize = (num_cols * scale, num_rows * scale)
    _, axes = pyplot().subplots(num_rows, num_cols, figsize=figsize)
    axes = axes.flatten()
    for i, (ax, img) in enumerate(zip(axes, imgs, strict=False)):
        img = img.detach().cpu().numpy() if hasattr(img, "detach") else img
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
        xlabel=None,
        ylabel=None,
        legend=None,
        xlim=None,
        ylim=None,
        xscale="linear",
        yscale="linear",
        fmts=("-", "m--", "g-.", "r:"),
        nrows=1,
        ncols=1,
        figsize=(3.5, 2.5),
        title=None,
        min_interval=0.5,
    ):
        legend = legend or []
        plt = pyplot()
        self.fig, self.axes = plt.subplots(nrows, ncols, figsize=figsize)
        plt.close(self.fig)  # shown only through the display handle, never twice by inline
        if nrows * ncols == 1:
            self.axes = [self.axes]
        self.config_axes = lambda: set_axes(
            self.axes[0], xlabel, ylabel, xlim, ylim, xscale, yscale, legend
        )
        self.title, self.fmts, self.X, self.Y = title, fmts, None, None
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
