"""img/ holds exactly what scripts/make_diagrams.py draws, and every label fits where it sits."""

import diagram_kit as kit
import make_diagrams
import pytest
from conftest import ROOT

IMG = ROOT / "img"


def test_regenerating_img_changes_nothing(tmp_path, capsys):
    assert make_diagrams.main([str(tmp_path)]) == 0
    assert "warning" not in capsys.readouterr().out
    for name in make_diagrams.DIAGRAMS:
        fresh = (tmp_path / f"{name}.svg").read_bytes()
        assert (IMG / f"{name}.svg").read_bytes() == fresh, f"img/{name}.svg is stale"


def test_every_svg_in_img_is_drawn_by_the_script():
    drawn = {f"{name}.svg" for name in make_diagrams.DIAGRAMS}
    stray = sorted(p.name for p in IMG.glob("*.svg") if p.name not in drawn)
    assert not stray, f"drawn by hand, so no check that they fit: {stray}"


@pytest.mark.parametrize("name", list(make_diagrams.DIAGRAMS))
def test_every_label_fits(name):
    assert kit.layout_problems(make_diagrams.render(name)) == []


def drawing(*body):
    return kit.svg(400, 200, "test", list(body))


def test_fit_check_catches_what_the_old_data_parallel_diagram_did():
    # The old lesson-5 diagram: 'shard 0: about B/k examples' at 14 px in a box 160 px wide
    assert kit.text_width("shard 0: about B/k examples", "label") > 160 - 2 * kit.PAD_X
    overflow = drawing(kit.box(40, 20, 160, 120), kit.text(120, 60, "shard 0: about B/k examples"))
    assert kit.layout_problems(overflow) == [
        "'shard 0: about B/k examples' is wider than the box at x=40, y=20"
    ]
    fits = drawing(kit.box(40, 20, 160, 120), kit.text(120, 60, "shard 0", "label"))
    assert kit.layout_problems(fits) == []


def test_fit_check_catches_crossings_overlaps_and_the_canvas_edge():
    crossing = drawing(kit.box(100, 20, 100, 40), kit.text(90, 45, "half in", "small", "start"))
    assert kit.layout_problems(crossing) == ["'half in' crosses the edge of the box at x=100, y=20"]
    overlapping = drawing(kit.text(100, 100, "first label"), kit.text(110, 104, "second"))
    assert kit.layout_problems(overlapping) == ["'first label' overlaps 'second'"]
    outside = drawing(kit.text(395, 100, "too far right", "small", "start"))
    assert kit.layout_problems(outside) == ["'too far right' leaves the 400x200 canvas"]


def test_text_width_grows_with_length_and_size():
    assert kit.text_width("abcd", "small") > kit.text_width("abc", "small") > 0
    assert kit.text_width("abc", "title") > kit.text_width("abc", "small")
    mono = kit.text_width("iiii", "code")
    assert mono == pytest.approx(kit.text_width("WWWW", "code"))  # monospace


def test_check_reports_missing_and_stale_files(tmp_path):
    assert any("missing" in p for p in make_diagrams.check(tmp_path))
    make_diagrams.main([str(tmp_path)])
    assert make_diagrams.check(tmp_path) == []
    path = tmp_path / "devices.svg"
    path.write_text(path.read_text().replace("GPU 0", "GPU 9"))
    assert make_diagrams.check(tmp_path) == [
        "devices.svg: stale; run python scripts/make_diagrams.py to redraw it"
    ]
