"""ProgressBoard, the board the book's Trainer draws its curves on (d2l 1.0), live like Animator."""

from __future__ import annotations

from collections import OrderedDict, namedtuple

from .._live import LiveFigure
from .._typed import wrap_public
from ..plotting import pyplot
from .hparams import HyperParameters

Point = namedtuple("Point", ["x", "y"])  # a drawn point of ProgressBoard.data


class ProgressBoard(HyperParameters):
    """The book's board (d2l 1.0) that plots points in animation, averaged `every_n` at a time.

    What Trainer.fit draws its curves on; `data[label]` holds the drawn Points. Same live
    behaviour as Animator.
    """

    def __init__(
        self,
        xlabel=None,
        ylabel=None,
        xlim=None,
        ylim=None,
        xscale="linear",
        yscale="linear",
        ls=("-", "--", "-.", ":"),
        colors=("C0", "C1", "C2", "C3"),
        fig=None,
        axes=None,
        figsize=(3.5, 2.5),
        display=True,
    ):
        self.save_hyperparameters()
        self.raw_points: OrderedDict[str, list[Point]] = OrderedDict()
        self.data: OrderedDict[str, list[Point]] = OrderedDict()
        self._view = None  # made at the first point drawn, so unused boards cost nothing

    def draw(self, x, y, label: str, every_n: int = 1) -> None:
        """Add point (x, y) to line `label`; every `every_n` points, plot their mean."""
        points = self.raw_points.setdefault(label, [])
        line = self.data.setdefault(label, [])
        points.append(Point(x, y))
        if len(points) < max(1, int(every_n)):  # the book's every_n=0 never drew at all
            return
        line.append(Point(_mean(p.x for p in points), _mean(p.y for p in points)))
        points.clear()
        if not self.display:
            return
        if self._view is None:
            self._view = LiveFigure(self._render)
        self._view.changed()

    def show(self) -> None:
        """Draw the board now (in a notebook: display it, or update the one shown)."""
        if self._view is None:
            self._view = LiveFigure(self._render)
        self._view.show()

    def _render(self):
        if self.axes is None:
            if self.fig is None:
                plt = pyplot()
                self.fig = plt.figure(figsize=self.figsize)
                plt.close(self.fig)
            self.axes = self.fig.add_subplot() if not self.fig.axes else self.fig.axes[0]
        elif self.fig is None:
            self.fig = self.axes.figure
        ax = self.axes
        ax.cla()
        lines = []
        for (label, pts), ls, color in zip(self.data.items(), self.ls, self.colors, strict=False):
            (artist,) = ax.plot([p.x for p in pts], [p.y for p in pts], linestyle=ls, color=color)
            lines.append((artist, label))
        if self.xlim:
            ax.set_xlim(self.xlim)
        if self.ylim:
            ax.set_ylim(self.ylim)
        ax.set_xlabel(self.xlabel)
        ax.set_ylabel(self.ylabel)
        ax.set_xscale(self.xscale)
        ax.set_yscale(self.yscale)
        if lines:
            ax.legend([a for a, _ in lines], [label for _, label in lines])
        return self.fig


def _mean(values) -> float:
    """Mean of numbers or 0-d tensors, as a float (one device sync for tensors)."""
    values = list(values)
    return float(sum(values) / len(values))


wrap_public(globals())  # a misfitting argument named in a sentence (_typed.py)
