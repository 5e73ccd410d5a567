"""nbgrader's settings for the d2l-gpu course: scripts/grading.py copies this file into the
course folder as nbgrader_config.py, beside grading_release.py."""

import os
import sys

from nbgrader.converters import GenerateAssignment
from nbgrader.preprocessors import ClearSolutions

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from grading_release import StarterCells  # noqa: E402

c = get_config()  # noqa: F821 (traitlets defines it for a config file)
c.CourseDirectory.course_id = "d2l-gpu"
c.CourseDirectory.root = HERE
# a release shows the lesson's own starter cells (grading_release.py), not nbgrader's stub
c.GenerateAssignment.preprocessors = [
    StarterCells if p is ClearSolutions else p
    for p in GenerateAssignment.class_traits()["preprocessors"].default()
]
# lesson 6's first exercise trains eight networks in one cell, minutes on a two-core CPU (and
# more on a slower one). A cell that runs longer than this (an answer that never ends) is
# stopped, and the question it answers scores 0
c.Execute.timeout = 3600
# a test cell that a student deleted is put back (and runs), as an edited one is restored
c.OverwriteCells.add_missing_cells = True
