"""Animator and ProgressBoard: one figure per cell, updated in place, complete when the cell ends.

Most tests run the live machinery against a stand-in shell (IPython's own EventManager, display
recorded); the last one runs a real kernel through nbclient and reads what the notebook kept.
"""

import re

import nbformat
import pytest
from IPython.core.events import EventManager, available_events
from nbclient import NotebookClient

from d2l_gpu import _live, plotting
from d2l_gpu.book import board as book_board


class Handle:
    """Stands in for IPython's DisplayHandle; records the points of each figure it is given."""

    def __init__(self, shown):
        self.shown = shown

    def update(self, fig):
        self.shown.append(("update", points(fig)))


def points(fig) -> int:
    """How many data points the figure's lines hold."""
    return sum(len(line.get_xdata()) for ax in fig.axes for line in ax.lines)


class Shell:
    """A Jupyter kernel's shell as far as _live uses it: post_run_cell events."""

    def __init__(self):
        self.events = EventManager(self, available_events)

    def end_cell(self):
        self.events.trigger("post_run_cell", None)


@pytest.fixture
def kernel(monkeypatch):
    """A stand-in kernel: returns (shell, shown), shown listing ('display'|'update', points)."""
    from IPython import display

    shell, shown = Shell(), []

    def fake_display(fig, display_id=False):
        shown.append(("display", points(fig)))
        return Handle(shown) if display_id else None

    def no_clearing(*args, **kwargs):
        raise AssertionError("clear_output would wipe the cell's other output")

    monkeypatch.setattr(_live, "kernel_shell", lambda: shell)
    monkeypatch.setattr(display, "display", fake_display)
    monkeypatch.setattr(display, "clear_output", no_clearing)
    return shell, shown


def test_live_animator_throttles_then_completes_when_the_cell_ends(kernel, monkeypatch):
    monkeypatch.setenv("D2L_GPU_LIVE_PLOTS", "1")
    shell, shown = kernel
    anim = plotting.Animator(xlabel="epoch", min_interval=3600)
    for epoch in range(1, 6):
        anim.add(epoch, 0.1 * epoch)
    assert shown == [("display", 1)]  # the first point at once, the others throttled
    shell.end_cell()
    assert shown == [("display", 1), ("update", 5)]  # the same output, now complete
    assert shell.events.callbacks["post_run_cell"] == []  # the callback removed itself
    anim.add(6, 0.6)  # a later cell shows its own figure
    shell.end_cell()
    assert shown[2:] == [("display", 6)]


def test_live_animator_redraws_when_the_interval_has_passed(kernel, monkeypatch):
    monkeypatch.setenv("D2L_GPU_LIVE_PLOTS", "yes")
    shell, shown = kernel
    anim = plotting.Animator(min_interval=0)
    for epoch in range(3):
        anim.add(epoch, (1.0, 2.0))
    shell.end_cell()
    assert shown == [("display", 2), ("update", 4), ("update", 6)]  # nothing left to flush


@pytest.mark.parametrize("value", ["0", "off", "False", "NO"])
def test_headless_kernel_draws_once_at_the_end(kernel, monkeypatch, value):
    monkeypatch.setenv("D2L_GPU_LIVE_PLOTS", value)
    shell, shown = kernel
    anim = plotting.Animator(min_interval=0)
    assert not anim.live
    for epoch in range(4):
        anim.add(epoch, epoch)
    assert shown == []
    shell.end_cell()
    assert shown == [("display", 4)]


def test_show_displays_once_and_the_end_of_cell_adds_nothing(kernel, monkeypatch):
    monkeypatch.setenv("D2L_GPU_LIVE_PLOTS", "0")
    shell, shown = kernel
    anim = plotting.Animator()
    anim.add([1, 1], [0.5, 0.7])
    anim.show()
    shell.end_cell()
    assert shown == [("display", 2)]


@pytest.mark.parametrize(
    "value, live", [("1", True), ("TRUE", True), ("On", True), (" yes ", True), ("", True)]
)
def test_live_plots_values(monkeypatch, value, live):
    monkeypatch.setenv("D2L_GPU_LIVE_PLOTS", value)
    assert _live.live_plots_enabled() is live


@pytest.mark.parametrize("value", ["2", "enabled", "none", "0.0"])
def test_live_plots_other_values_are_a_clear_error(monkeypatch, value):
    monkeypatch.setenv("D2L_GPU_LIVE_PLOTS", value)
    with pytest.raises(ValueError, match=r"D2L_GPU_LIVE_PLOTS=.*0, 1, false, true, off, on, no"):
        plotting.Animator()


def test_animator_headless_records_without_drawing(monkeypatch):
    monkeypatch.setenv("D2L_GPU_LIVE_PLOTS", "0")
    anim = plotting.Animator(xlabel="epoch", legend=["train", "test"])
    assert not anim.live
    for epoch in range(3):
        anim.add(epoch + 1, (0.5 + 0.1 * epoch, None))
    assert anim.X[0] == [1, 2, 3] and anim.X[1] == [] and anim.Y[0][-1] == 0.7
    assert len(anim.axes[0].lines) == 0  # nothing drawn yet
    anim.show()  # no IPython shell here: draws, displays nothing, raises nothing
    assert len(anim.axes[0].lines) == 2


def test_animator_is_not_live_outside_a_kernel(monkeypatch):
    monkeypatch.delenv("D2L_GPU_LIVE_PLOTS", raising=False)
    assert _live.kernel_shell() is None and not plotting.Animator().live


def test_progress_board_averages_every_n_points(kernel, monkeypatch):
    monkeypatch.setenv("D2L_GPU_LIVE_PLOTS", "1")
    shell, shown = kernel
    board = book_board.ProgressBoard(xlabel="x", ylim=(0, 10))
    for x in range(6):
        board.draw(x, float(x), "line", every_n=2)
    assert board.data["line"] == [(0.5, 0.5), (2.5, 2.5), (4.5, 4.5)]
    assert board.raw_points["line"] == []
    shell.end_cell()
    assert shown == [("display", 1), ("update", 3)]


def test_progress_board_every_n_below_one_still_draws(monkeypatch):
    """The book's board never draws a line whose every_n rounds to 0; this one draws each point."""
    monkeypatch.setenv("D2L_GPU_LIVE_PLOTS", "0")
    board = book_board.ProgressBoard(display=False)
    for x in range(3):
        board.draw(x, 1.0, "val_loss", every_n=0)
    assert [p.x for p in board.data["val_loss"]] == [0, 1, 2]
    assert board.fig is None  # display=False: never a figure


def test_progress_board_show_draws_every_line():
    board = book_board.ProgressBoard(xlabel="epoch")
    for x in range(4):
        board.draw(x, x, "train_loss")
        board.draw(x, 2 * x, "val_loss", every_n=2)
    board.show()
    assert [len(line.get_xdata()) for line in board.axes.lines] == [4, 2]
    assert board.axes.get_legend() is not None


def test_plot_log_axes():
    ax = plotting.plot(
        [1, 10, 100],
        [[1, 2, 3], [3, 2, 1]],
        "size",
        "s",
        legend=["a", "b"],
        xscale="log",
        yscale="log",
    )
    assert ax.get_xscale() == "log" and len(ax.lines) == 2


NOTEBOOK_CELL = """\
from matplotlib.figure import Figure

import d2l_gpu as d2l

animator = d2l.Animator(xlabel="epoch", xlim=[0, 6], legend=["loss"])
# After the first figure (the inline backend resets the formats of figures when it starts):
# a figure's text/plain now says how many points it shows.
count = lambda fig: sum(len(line.get_xdata()) for ax in fig.axes for line in ax.lines)
text = get_ipython().display_formatter.formatters["text/plain"]
text.for_type(Figure, lambda fig, p, cycle: p.text(f"points={count(fig)}"))
print("before the loop")
for epoch in range(1, 6):
    animator.add(epoch, 1 / epoch)
print("after the loop")
"""


def test_animator_ends_complete_in_a_real_kernel(root, monkeypatch):
    """A live notebook cell that adds 5 points quickly and never calls show() keeps all 5."""
    monkeypatch.setenv("PYTHONPATH", str(root))
    monkeypatch.setenv("D2L_GPU_LIVE_PLOTS", "1")
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(NOTEBOOK_CELL))
    NotebookClient(nb, timeout=60, kernel_name="python3").execute()
    outputs = nb.cells[0].outputs
    kinds = [o.output_type for o in outputs]
    assert kinds == ["stream", "display_data", "stream"], outputs  # one figure, no clearing
    assert outputs[0].text == "before the loop\n" and outputs[2].text == "after the loop\n"
    assert outputs[1].data["text/plain"] == "points=5"


def test_bars_draws_one_bar_per_label_or_a_group_per_label():
    import matplotlib

    matplotlib.use("Agg")
    ax = plotting.bars(["a", "b", "c"], [1.0, 2.0, 4.0], "ms", "title", note="a note")
    assert [p.get_height() for p in ax.patches] == [1.0, 2.0, 4.0]
    assert ax.get_title() == "title" and ax.get_ylim()[1] == pytest.approx(4.0 * 1.3)
    assert any(t.get_text() == "a note" for t in ax.texts)
    grouped = plotting.bars(["cpu", "cuda:0"], {"host": [3.0, 5.0], "device": [1.0, 2.0]}, "us")
    assert [p.get_height() for p in grouped.patches] == [3.0, 5.0, 1.0, 2.0]
    assert [t.get_text() for t in grouped.get_legend().get_texts()] == ["host", "device"]
    assert [t.get_text() for t in grouped.get_xticklabels()] == ["cpu", "cuda:0"]
    plotting.pyplot().close("all")


@pytest.mark.parametrize("labels, values, words", [
    (["a", "b"], [1.0], "one value per label (2 labels)"),
    (["a"], {"x": [1.0], "y": [1.0, 2.0]}, "one value per label (1 labels)"),
    (["a"], ["many"], "must hold numbers"),
])  # fmt: skip
def test_bars_refuses_values_that_do_not_fit_its_labels(labels, values, words):
    with pytest.raises((ValueError, TypeError), match=re.escape(words)):
        plotting.bars(labels, values, "ms")
