"""The questions in words of the lessons' exercises, as cells graded by hand in the nbgrader course.

An exercise whose text (in the English lesson) asks a question gets, after its last cell, a
markdown answer cell worth one point that an instructor grades by hand in nbgrader's formgrader.
In the course's source it holds the worked solution's prose for that exercise (the instructor's
key); the release shows the student a short prompt instead (`d2l_gpu.starter`, put there by
grading_release.py). The exercises are matched across editions by cell id, which the Chinese
edition keeps, so the Chinese course grades the same questions with its own prose.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import nbformat
import nbtools
from grading_code import GradingError

NEW_EXERCISE = re.compile(r"^\d+\. \*\*")  # "3. **Fix the bug.**": an exercise's text begins
QUESTION_MARKS = ("?", "？")
SOLUTION_HEADING = re.compile(r"^## (?:Exercise|练习|Bài tập) (\d+)")
PROMPT = {
    "": "**Your answer to the questions of exercise {n}** (graded by hand): write it here, in a "
    "few sentences, and say which output it rests on.",
    "vi": "**Câu trả lời cho các câu hỏi của bài tập {n}** (giáo viên chấm): viết ở đây, vài câu, "
    "và nói câu trả lời dựa trên kết quả nào.",
    "zh": "**练习 {n} 中问题的回答**（由老师批改）：在这里用几句话写下你的回答，"
    "并说明它依据的是哪个输出。",
}


@dataclass
class Written:
    """An exercise's questions in words: where the exercise ends, and a model answer."""

    number: int
    last: int  # the index, in the edition's lesson, of the exercise's last cell
    model: str  # the worked solution's prose for the exercise (the instructor's key)


def asking(english, at: int) -> dict[int, tuple[str, bool]]:
    """Exercise number -> (id of the cell where its text begins, whether that text asks)."""
    found: dict[int, tuple[str, bool]] = {}
    for cell in english["cells"][at:]:
        if cell["cell_type"] != "markdown":
            continue
        for part in re.split(r"(?m)^(?=\d+\. \*\*)", nbtools._source(cell)):
            if NEW_EXERCISE.match(part):
                n = int(part.split(".", 1)[0])
                start, asked = found.get(n, (cell["id"], False))
                found[n] = (start, asked or any(mark in part for mark in QUESTION_MARKS))
    return found


def prose(sol) -> dict[int, str]:
    """Exercise number -> the solutions notebook's prose under its `## Exercise N` heading."""
    texts: dict[int, list[str]] = {}
    current = None
    for cell in sol["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        source = nbtools._source(cell)
        heading = SOLUTION_HEADING.match(source)
        if heading:
            current, source = int(heading[1]), source.partition("\n")[2]
        if current is not None and source.strip():
            texts.setdefault(current, []).append(source.strip())
    return {n: "\n\n".join(parts) for n, parts in texts.items()}


def written(nb, sol, english, at: int) -> list[Written]:
    """Every exercise of lesson `nb` that asks a question in words, with its model answer from
    `sol`; `english` is the English lesson (`nb` itself for the English course), whose
    `## Exercises` heading is cell `at`."""
    exercises, answers = asking(english, at), prose(sol)
    ids = [c["id"] for c in english["cells"]]
    where = {c["id"]: i for i, c in enumerate(nb["cells"])}
    found = []
    for n, (start, asks) in sorted(exercises.items()):
        if not asks:
            continue
        if not answers.get(n):
            raise GradingError(f"exercise {n} asks a question that the solutions do not answer")
        later = [ids.index(s) for k, (s, _) in exercises.items() if ids.index(s) > ids.index(start)]
        last_id = ids[min(later) - 1] if later else ids[-1]
        found.append(Written(n, where.get(last_id, len(nb["cells"]) - 1), answers[n]))
    return found


def written_cell(w: Written, edition: str = "") -> nbformat.NotebookNode:
    """The markdown answer cell for `w`, worth one point, graded by hand."""
    cell = nbformat.v4.new_markdown_cell(w.model)
    flags = {"grade": True, "solution": True, "locked": False, "points": 1}
    cell.metadata["nbgrader"] = {**flags, "grade_id": f"written-{w.number}", "schema_version": 3}
    cell.metadata["d2l_gpu"] = {"starter": PROMPT[edition].format(n=w.number)}
    return cell
