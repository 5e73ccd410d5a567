"""scripts/slow_machine.py: the process-launching notebooks on one busy core, and where its time
goes (seconds per notebook, from the run's JUnit report)."""

from __future__ import annotations

import slow_machine

REPORT = """<testsuites><testsuite>
<testcase classname="notebooks.07-ddp-torchrun.ipynb" name="Cell 0" time="1.5"/>
<testcase classname="solutions.12-synchronisation.ipynb" name="Cell 0" time="4.0"/>
<testcase classname="notebooks.07-ddp-torchrun.ipynb" name="Cell 1" time="2.0"/>
</testsuite></testsuites>"""


def test_seconds_are_summed_per_notebook_the_longest_first(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(REPORT)
    assert slow_machine.seconds_per_notebook(report) == [
        "     4.0 s  solutions/12-synchronisation.ipynb",
        "     3.5 s  notebooks/07-ddp-torchrun.ipynb",
    ]


def test_an_unknown_notebook_is_refused_in_a_sentence(capsys):
    assert slow_machine.main(["notebooks/99-none.ipynb"]) == 2
    assert "no such notebook: notebooks/99-none.ipynb" in capsys.readouterr().err
