"""What `nbgrader generate_assignment` releases in an answer cell: the lesson's own starter.

scripts/grading.py copies this file into the course folder, and the course's nbgrader_config.py
puts `StarterCells` in the place of nbgrader's `ClearSolutions`. An answer cell keeps the lesson's
starter in its metadata (`d2l_gpu.starter`); a student then sees the exercise as the lesson
shows it, with its `...` and TODO, rather than nbgrader's `raise NotImplementedError()`.
"""

from __future__ import annotations

from typing import Any

from nbgrader.preprocessors import ClearSolutions


class StarterCells(ClearSolutions):
    """ClearSolutions, then each answer cell's starter in the place of its solution."""

    def preprocess_cell(self, cell: Any, resources: Any, cell_index: int) -> tuple[Any, Any]:
        starter = cell.metadata.get("d2l_gpu", {}).get("starter")
        cell, resources = super().preprocess_cell(cell, resources, cell_index)
        if starter is not None:
            cell.source = starter
        return cell, resources
