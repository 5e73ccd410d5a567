"""Animator draws live only when watched, and shows one final figure."""

from d2l_gpu import plotting


def test_animator_headless_records_without_drawing(monkeypatch):
    monkeypatch.setenv("D2L_GPU_LIVE_PLOTS", "0")
    anim = plotting.Animator(xlabel="epoch", legend=["train", "test"])
    assert not anim.live
    for epoch in range(3):
        anim.add(epoch + 1, (0.5 + 0.1 * epoch, None))
    assert anim.X[0] == [1, 2, 3] and anim.X[1] == [] and anim.Y[0][-1] == 0.7
    anim.show()  # no IPython shell here: draws, displays nothing, raises nothing
    assert len(anim.axes[0].lines) == 2


def test_animator_is_not_live_outside_a_kernel(monkeypatch):
    monkeypatch.delenv("D2L_GPU_LIVE_PLOTS", raising=False)
    assert not plotting._watched()


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
