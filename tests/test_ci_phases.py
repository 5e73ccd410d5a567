"""scripts/ci_phases.py: CI's phases timed against budgets scaled by the machine's speed."""

from __future__ import annotations

import sys

import ci_phases
import pytest


def test_the_factor_scales_slower_machines_only():
    assert ci_phases.speed_factor(ci_phases.REFERENCE_SECONDS / 2) == 1.0  # faster: as is
    assert ci_phases.speed_factor(2 * ci_phases.REFERENCE_SECONDS) == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("seconds", "factor", "over"),
    [(149, 1.0, False), (151, 1.0, True), (299, 2.0, False), (301, 2.0, True)],
)
def test_a_phase_overruns_past_half_again_its_scaled_budget(seconds, factor, over):
    assert ci_phases.overran(seconds, 100, factor) is over


def test_the_report_names_only_the_phase_that_overran():
    rows = [("check", 80.0, 90.0, 1.0, 0, 70.0), ("test-slow", 1400.0, 900.0, 1.0, 0, 2500.0)]
    table, failed = ci_phases.report(rows, wall=1500.0)
    assert "check" in table and "test-slow" in table and "sum of the phases" in table
    assert table.splitlines()[-2].split()[-1] == "2570"  # CPU seconds summed
    assert table.splitlines()[-1].split()[-1] == "1500"  # the whole run's wall time
    assert len(failed) == 1 and failed[0].startswith("CI phase 'test-slow' took 1400 s")
    assert ci_phases.report(rows[:1])[1] == []  # the negative control: within budget


def test_run_records_the_phase_and_returns_its_status(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ci_phases, "TABLE", tmp_path / "ci-phases.tsv")
    (tmp_path / "ci-speed").write_text("2.000\n")
    code = "import sys, time\nend = time.process_time() + 0.3\n"
    code += "while time.process_time() < end: pass\nsys.exit(3)"
    assert ci_phases.main(["run", "quick", "10", "--", sys.executable, "-c", code]) == 3
    [(name, seconds, budget, factor, status, cpu)] = ci_phases.read_rows(tmp_path / "ci-phases.tsv")
    assert (name, budget, factor, status) == ("quick", 10.0, 2.0, 3)
    assert 0 <= seconds < 60
    assert 0.3 <= cpu < 60  # the command's own CPU time, counted once it has ended
    assert "phase quick:" in capsys.readouterr().out


def test_report_fails_with_the_sentence(tmp_path, monkeypatch, capsys):
    table = tmp_path / "ci-phases.tsv"
    table.write_text("make test\t2000.0\t600\t1.000\t0\t3000.0\n")
    monkeypatch.setattr(ci_phases, "TABLE", table)
    assert ci_phases.main(["begin"]) == 0  # the run's wall time counts from here
    assert ci_phases.main(["report"]) == 1
    out, err = capsys.readouterr()
    assert "CI phase 'make test' took 2000 s" in err
    assert "the whole run (wall)" in out


@pytest.mark.parametrize(
    "argv", [[], ["run", "x"], ["run", "x", "ten", "--", "true"], ["bogus"], ["begin", "x"]]
)
def test_a_wrong_command_line_is_refused_with_the_usage(argv, capsys):
    assert ci_phases.main(argv) == 2
    assert "usage: ci_phases.py" in capsys.readouterr().err
