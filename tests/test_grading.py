"""The graded course (scripts/grading.py): built from the lessons, and run end to end, offline.

The loop an instructor runs with nbgrader, in one temporary folder, on lesson 2: build, generate,
release; four students fetch and submit; collect, autograde, generate and release feedback; the
students fetch it. Sentinels: the worked solutions score full marks; the untouched release scores
0 (and does not hang); a plausible wrong answer (tests/answers) loses that question's point only,
although its student also rewrote that question's locked test and deleted another; an answer that
never ends is stopped by the timeout and scores 0 for its question alone; a wrong answer that
redefines `check` to agree passes the visible check and fails the hidden tests. Each exercise's
questions in words get an answer cell graded by hand: written, it waits for the instructor; left
as released, it scores 0 without one.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import grading
import grading_code
import nbformat
import nbtools
import pytest

ROOT = Path(__file__).resolve().parent.parent
LESSON = "02-tensors"
COURSE = "d2l-gpu"
pytest.importorskip("nbgrader")


def graded_ids(nb, kind: str) -> list[str]:
    """The grade ids of a notebook's nbgrader cells of one kind (`answer` or `check`)."""
    ids = [c.metadata.get("nbgrader", {}).get("grade_id", "") for c in nb.cells]
    return [i for i in ids if i.startswith(f"{kind}-")]


def test_every_exercise_check_is_graded_once():
    """Each check of tests/answers is one locked test cell of its lesson's assignment, but the
    two opted-in torch.compile exercises (grading.OPTIONAL), which are named, not graded."""
    for stem in grading.lessons():
        nb = nbtools.load(ROOT / "notebooks" / f"{stem}.ipynb")
        source = grading.assignment(nb, nbtools.load(ROOT / "solutions" / f"{stem}.ipynb"), stem)
        tests = [c.source for c in source.cells if "check-" in _grade_id(c)]
        starters = [
            c.metadata["d2l_gpu"]["starter"] for c in source.cells if "answer-" in _grade_id(c)
        ]
        left = [k for k in grading.OPTIONAL if k[0] == stem]
        covered = set()
        for case in grading.wrong_answers(stem):
            found = [
                i
                for i, (t, s) in enumerate(zip(tests, starters, strict=True))
                if case.cell in t + s
            ]
            optional = [k for k in left if k[1] in nbtools._source(_cell_with(nb, case.cell))]
            assert len(found) + len(optional) == 1, f"{stem}: {case.why}"
            covered.update(found)
        assert covered == set(range(len(tests))), f"{stem}: a graded check with no case"


def test_each_solution_is_the_solutions_notebooks():
    """The graded solution of every answer cell is code of solutions/ (or the starter's own
    statements that ask for nothing), statement for statement, and the release's starter is the
    lesson's, so neither can drift from what students read."""
    for stem in grading.lessons():
        nb = nbtools.load(ROOT / "notebooks" / f"{stem}.ipynb")
        sol = nbtools.load(ROOT / "solutions" / f"{stem}.ipynb")
        worked = grading_code._bare("".join(nbtools._source(c) for c in sol["cells"]))
        lesson = grading_code._bare("".join(nbtools._source(c) for c in nb["cells"]))
        for cell in grading.assignment(nb, sol, stem).cells:
            if "answer-" not in _grade_id(cell):
                continue
            begin, *solution, end = cell.source.splitlines()
            assert (begin, end) == grading.SOLUTION
            for statement in grading_code.statements("\n".join(solution)):  # or the starter's own
                bare = grading_code._bare(statement)
                assert bare in worked or bare in lesson, f"{stem}: {statement[:60]!r}"
            for part in cell.metadata["d2l_gpu"]["starter"].split("\n\n\n"):  # cells joined
                assert grading_code._bare(part) in lesson, f"{stem}: {part[:60]!r}"


def test_a_check_missing_from_the_solutions_is_named():
    nb = nbtools.load(ROOT / "notebooks" / f"{LESSON}.ipynb")
    sol = nbtools.load(ROOT / "solutions" / f"{LESSON}.ipynb")
    for cell in sol["cells"]:
        cell["source"] = nbtools._source(cell).replace("check(", "print(")
    with pytest.raises(grading.GradingError, match="no cell of the solutions holds the check"):
        grading.assignment(nb, sol, LESSON)


def test_a_check_that_indenting_would_change_is_refused():
    assert grading_code.indented("check(x)\n") == "    check(x)\n"
    with pytest.raises(grading.GradingError, match="changes meaning when indented"):
        grading_code.indented('check(x, """a\nb""")')


def test_the_build_names_an_unknown_lesson(tmp_path, capsys):
    with pytest.raises(SystemExit):
        grading.main(["--out", str(tmp_path), "99"])
    assert "no lesson 99" in capsys.readouterr().err


def test_starters_are_what_students_fill_in():
    assert grading_code.is_starter("x = ...  # TODO")
    assert grading_code.is_starter("def f():\n    ...\n")
    assert grading_code.is_starter("n = 2\n# TODO: a loop that fills in d\n")
    assert not grading_code.is_starter("if answer is ...:\n    pass\n")  # a test for an answer


def _grade_id(cell) -> str:
    return cell.metadata.get("nbgrader", {}).get("grade_id", "")


def _cell_with(nb, needle: str):
    return next(c for c in nb["cells"] if c["cell_type"] == "code" and needle in nbtools._source(c))


# --- the loop, end to end ---------------------------------------------------------------------


def nbgrader(exchange: Path, *commands: tuple[Path, list[str]], timeout: float = 300) -> str:
    """Run nbgrader commands, each `(folder, arguments)`, against the exchange folder, in one
    process (tests/nbgrader_batch.py: the same applications as the `nbgrader` command); return
    what they printed. Each person has their own cache of what they submitted (nbgrader keeps it
    under ~ by default)."""
    batch = [
        (str(cwd), [*args, f"--Exchange.root={exchange}",
                    f"--Exchange.cache={exchange.parent / 'cache' / cwd.name}"])
        for cwd, args in commands
    ]  # fmt: skip
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "nbgrader_batch.py")],
                          input=json.dumps(batch), env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 0, f"an nbgrader command failed:\n{said[-3000:]}"
    return said


TAMPERED = "def check(answer, test, hint):\n    print('correct')\n\n\n"  # passes anything


def answered(release: Path, source: Path, edits: dict[str, str]) -> nbformat.NotebookNode:
    """The released notebook with every answer cell solved, then the cells in `edits` (grade id
    to new source; "" deletes the cell) changed as a student would change them."""
    nb = nbformat.read(release, as_version=4)
    solved = {_grade_id(c): c.source for c in nbformat.read(source, as_version=4).cells}
    cells = []
    for cell in nb.cells:
        gid = _grade_id(cell)
        if gid.startswith("answer-"):
            cell.source = "\n".join(solved[gid].splitlines()[1:-1])  # less the markers
        if gid in edits:
            if not edits[gid]:
                continue
            cell.source = edits[gid]
        cells.append(cell)
    nb.cells = cells
    return nb


@pytest.mark.slow
def test_the_course_loop_grades_and_gives_feedback(tmp_path):
    course, exchange = tmp_path / "course", tmp_path / "exchange"
    grading.build(course, [LESSON])
    nbgrader(
        exchange,
        (course, ["generate_assignment", LESSON, "--force"]),
        (course, ["release_assignment", LESSON, "--force"]),
    )
    release = course / "release" / LESSON / f"{LESSON}.ipynb"
    assert "BEGIN SOLUTION" not in release.read_text()
    assert "float32_mib = ...  # your number" in release.read_text()  # the lesson's own starter

    wrong = importlib.import_module("answers.l02").CASES[0].wrong.replace  # MB for MiB
    source = course / "source" / LESSON / f"{LESSON}.ipynb"
    fetched = nbformat.read(release, as_version=4)
    starter = next(c.source for c in fetched.cells if _grade_id(c) == "answer-1")
    for old, new in wrong:
        starter = starter.replace(old, new)
    starter_3 = next(c.source for c in fetched.cells if _grade_id(c) == "answer-3")
    models = {
        _grade_id(c): c.source for c in nbformat.read(source, 4).cells if c.cell_type == "markdown"
    }
    written = {gid: text for gid, text in models.items() if gid.startswith("written-")}
    assert sorted(written) == ["written-1", "written-2", "written-3"]  # each asks a question
    prompt = next(c.source for c in fetched.cells if _grade_id(c) == "written-1")
    assert prompt.startswith("**Your answer to the questions of exercise 1** (graded by hand)")
    students = {
        "ada": answered(release, source, written),  # the worked solutions, in code and words
        "bert": fetched,  # hands in the release untouched
        "cleo": answered(
            release,
            source,
            {
                "answer-1": starter,
                "check-1": 'with must_pass():\n    print("correct")',  # a locked test rewritten
                "check-3": "",  # and another deleted
            },
        ),
        "dana": answered(
            release,
            source,
            {
                "answer-2": "import time\n\nwhile True:\n    time.sleep(1)",  # never ends
                "answer-3": TAMPERED + starter_3,  # the bug left in, and `check` made to agree
            },
        ),
    }
    fetchers = ("ada", "cleo")  # two fetch it; the others' copy is the same notebook
    for student in students:
        (tmp_path / student).mkdir()
    fetch = ["fetch_assignment", LESSON, f"--course={COURSE}"]
    nbgrader(exchange, *[(tmp_path / student, fetch) for student in fetchers])
    submits = []
    for student, nb in students.items():
        home = tmp_path / student
        if student in fetchers:
            assert nbformat.read(home / LESSON / f"{LESSON}.ipynb", 4) == fetched
        (home / LESSON).mkdir(exist_ok=True)
        nbformat.write(nb, home / LESSON / f"{LESSON}.ipynb")
        submits.append((home, ["submit", LESSON, f"--course={COURSE}", f"--student={student}"]))

    nbgrader(
        exchange,
        *submits,
        (course, ["collect", LESSON]),
        (course, ["autograde", LESSON, "--Execute.timeout=15"]),
        (course, ["generate_feedback", LESSON]),
        (course, ["release_feedback", LESSON]),
        (tmp_path / "cleo", ["fetch_feedback", LESSON, f"--course={COURSE}"]),
        timeout=600,
    )
    scores = _scores(course)
    assert scores["ada"] == [1.0, 1.0, 1.0], scores
    assert scores["bert"] == [0.0, 0.0, 0.0], scores
    assert scores["cleo"] == [0.0, 1.0, 1.0], scores  # the locked tests restored
    assert scores["dana"] == [1.0, 0.0, 0.0], scores  # stopped by the timeout; hidden tests
    words = _written(course)  # (score, waits for the instructor) of each written answer
    assert words["ada"] == [(0.0, True)] * 3, words  # written: the instructor grades them
    assert all(words[s] == [(0.0, False)] * 3 for s in ("bert", "cleo", "dana")), words  # blank

    pages = list((tmp_path / "cleo" / LESSON / "feedback").glob(f"*/{LESSON}.html"))
    assert len(pages) == 1
    page = pages[0].read_text()
    assert re.search(r"Score:\s*2(\.0)?\s*/\s*6(\.0)?", page), "no score 2 / 6 on cleo's page"
    assert "the check above did not say correct" in page  # why question 1 lost its point


def _written(course: Path) -> dict[str, list[tuple]]:
    """Each student's written answers: (score, whether it waits for the instructor)."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        return {
            student: [
                (g.score, g.needs_manual_grade)
                for g in (gb.find_grade(f"written-{n}", LESSON, LESSON, student) for n in (1, 2, 3))
            ]
            for student in ("ada", "bert", "cleo", "dana")
        }


def _scores(course: Path) -> dict[str, list[float]]:
    """Each student's score on the three questions of the lesson, from the gradebook."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        return {
            student: [gb.find_grade(f"check-{n}", LESSON, LESSON, student).score for n in (1, 2, 3)]
            for student in ("ada", "bert", "cleo", "dana")
        }


def test_must_pass_fails_unless_every_check_said_correct(capsys):
    names: dict = {}
    exec(grading.MUST_PASS, names)  # noqa: S102 - the locked cell, as the assignment runs it
    must_pass = names["must_pass"]
    with must_pass():
        print("correct")
    with must_pass():
        print("Exercise 2: the difference shrinks: True")
    for said in ("not yet: count again", "correct\nnot yet: bfloat16 is 2 bytes", "", "True"):
        with pytest.raises(AssertionError, match="did not say correct"), must_pass():
            print(said)
    with pytest.raises(NameError), must_pass():  # an answer never defined fails as itself
        print(undefined_answer)  # noqa: F821
    assert "not yet: count again" in capsys.readouterr().out  # the hint is still shown


def test_an_out_folder_that_cannot_be_written_is_named(tmp_path, capsys):
    taken = tmp_path / "a-file"
    taken.write_text("not a folder")
    assert grading.main(["--out", str(taken), "02"]) == 1
    said = capsys.readouterr().err
    assert said.startswith("grading.py: cannot write the course to --out") and str(taken) in said
    assert "Traceback" not in said and taken.read_text() == "not a folder"


@pytest.mark.parametrize("lang, heading", [("zh", "## 练习"), ("vi", "## Bài tập")])
def test_the_translated_courses_grade_the_same_code(tmp_path, lang, heading):
    """`grading.py --zh` (`--vi`) builds from notebooks/zh and solutions/zh (vi), whose code is
    the English code (scripts/zh.py): every code cell of each assignment, graded or not, is the
    same, and the written answers are the same ones, each in its edition's words."""
    en, other = tmp_path / "en", tmp_path / lang
    assert grading.main(["--out", str(en)]) == 0
    assert grading.main(["--out", str(other), f"--{lang}"]) == 0
    for stem in grading.lessons():
        path = Path("source", stem, f"{stem}.ipynb")
        cells = [nbformat.read(d / path, 4).cells for d in (en, other)]
        code = [[(c.source, c.metadata.get("nbgrader")) for c in nb if c.cell_type == "code"]
                for nb in cells]  # fmt: skip
        assert code[0] == code[1], stem
        written = [[(_grade_id(c), c.source) for c in nb if _grade_id(c).startswith("written-")]
                   for nb in cells]  # fmt: skip
        assert [g for g, _ in written[0]] == [g for g, _ in written[1]], stem
        assert all(a != b for (_, a), (_, b) in zip(*written, strict=True)), stem
        assert heading in (other / path).read_text(encoding="utf-8"), stem


def test_every_question_in_words_gets_an_answer_cell_graded_by_hand(tmp_path):
    """An exercise whose text asks a question gets one written answer worth a point, after its
    last cell, holding the solutions' prose for it; the Chinese course asks the same ones, in
    the same places, with its own prose. An exercise that asks nothing gets none."""
    import grading_written

    def written(edition):
        stem = "04-networks"
        nb = nbtools.load(ROOT / "notebooks" / edition / f"{stem}.ipynb")
        sol = nbtools.load(ROOT / "solutions" / edition / f"{stem}.ipynb")
        english = nbtools.load(ROOT / "notebooks" / f"{stem}.ipynb")
        found = grading_written.written(nb, sol, english, grading.exercises_at(english))
        return nb, found

    nb, en = written("")
    zh_nb, zh = written("zh")
    assert [w.number for w in en] == [1, 2] == [w.number for w in zh]  # 3 to 5 ask nothing
    for w, z in zip(en, zh, strict=True):
        assert nb["cells"][w.last]["id"] == zh_nb["cells"][z.last]["id"]  # the same place
        assert w.model and z.model and w.model != z.model  # each edition's own prose
    text = nbtools._source(nb["cells"][en[0].last + 1])
    assert re.match(r"2\. \*\*", text), "exercise 1's answer must come before exercise 2"
    cell = grading_written.written_cell(en[0])
    assert cell.metadata["nbgrader"]["points"] == 1 and cell.metadata["nbgrader"]["grade"]


def test_a_question_the_solutions_do_not_answer_is_named():
    nb = nbtools.load(ROOT / "notebooks" / "02-tensors.ipynb")
    sol = nbtools.load(ROOT / "solutions" / "02-tensors.ipynb")
    sol["cells"] = [c for c in sol["cells"] if c["cell_type"] == "code"]  # no prose at all
    with pytest.raises(grading_code.GradingError, match="exercise 1 asks a question"):
        grading.assignment(nb, sol, "02-tensors")


def test_a_worked_solution_fills_in_the_lessons_own_starter():
    """What the starter asks for comes from the solution, with the solution's statements that
    set what it uses (a loop included); the rest of the starter stays as the lesson wrote it."""
    starter = [(0, "k = rank_counts[-1]"), (0, "tie = ...  # TODO: bisect"), (0, "a = 1")]
    solution = [
        (5, "k = 4"),  # the solution's own set-up: the lesson's k stays
        (5, "low, high = 1.0, 9.0"),
        (5, "for _ in range(3):\n    low = (low + high) / 2"),
        (5, "print(low)"),
        (5, "tie = low"),
    ]
    out = grading_code.merged(starter, solution, lesson={"rank_counts", "tie", "k", "a"})
    assert [s for _, s in out] == [
        "k = rank_counts[-1]",
        "low, high = 1.0, 9.0",
        "for _ in range(3):\n    low = (low + high) / 2",
        "tie = low",
        "a = 1",
    ]
    assert grading_code.merged([(0, "x = ...")], [(1, "y = 2")], lesson={"x"}) is None  # no match
    assert grading_code.merged([(0, "x = 1")], solution, lesson=set()) is None  # asks for nothing


def test_the_solutions_call_the_lessons_helpers_as_the_lesson_defines_them():
    """A graded solution runs after the lesson's own cells, so a helper that the solutions' set-up
    defines again (lesson 9's `block`) must take the lesson's arguments, or the solution fails
    where a student's answer, written against the lesson, would not."""
    for stem in grading.lessons():
        lesson = {
            name: args
            for c in nbtools.load(ROOT / "notebooks" / f"{stem}.ipynb")["cells"]
            if c["cell_type"] == "code"
            for name, args in _functions(nbtools._source(c)).items()
        }
        sol = nbtools.load(ROOT / "solutions" / f"{stem}.ipynb")
        setup = next(c for c in sol["cells"] if c["cell_type"] == "code")
        for name, args in _functions(nbtools._source(setup)).items():
            assert lesson.get(name, args) == args, f"solutions/{stem}.ipynb redefines {name}()"


def _functions(source: str) -> dict[str, str]:
    """The top-level functions a cell defines, each with its arguments (as the AST dumps them)."""
    try:
        body = ast.parse(grading_code.TransformerManager().transform_cell(source)).body
    except SyntaxError:
        return {}
    return {n.name: ast.dump(n.args) for n in body if isinstance(n, ast.FunctionDef)}


def test_hidden_tests_catch_a_check_redefined_to_pass_anything():
    """Lesson 2's third test cell, visible part and hidden part, run after the lesson's cells that
    it needs: with the worked solution it passes; with `check` redefined in the answer to print
    `correct`, the visible part passes (the answer is wrong, but the check says nothing else) and
    the hidden part, which feeds the check a known wrong answer, fails."""
    nb = nbtools.load(ROOT / "notebooks" / f"{LESSON}.ipynb")
    source = grading.assignment(nb, nbtools.load(ROOT / "solutions" / f"{LESSON}.ipynb"), LESSON)
    cells = {_grade_id(c): c.source for c in source.cells}
    test = cells["check-3"]
    assert grading.HIDDEN[0] in test and "moves T to the CPU instead" in test
    context = [
        nbtools._source(_cell_with(nb, needle))
        for needle in ("import gc", "def other_device():", "def size_mib(")
    ]
    starter = next(
        c.metadata["d2l_gpu"]["starter"] for c in source.cells if _grade_id(c) == "answer-3"
    )
    for answer, fails in ((cells["answer-3"], False), (TAMPERED + starter, True)):
        names: dict = {"__name__": "__main__"}
        for code in [*context, cells["must-pass"], answer]:
            exec(grading_code.TransformerManager().transform_cell(code), names)  # noqa: S102
        visible = test.split(grading.HIDDEN[0])[0]
        exec(visible, names)  # noqa: S102 - passes both times
        if fails:
            with pytest.raises(AssertionError, match="passed a known wrong answer"):
                exec(test, names)  # noqa: S102
        else:
            exec(test, names)  # noqa: S102
