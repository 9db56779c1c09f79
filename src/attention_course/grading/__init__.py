"""Graded exercises: in-notebook checks and the instructor's grader.

In a notebook::

    from attention_course.grading import exercise
    check = exercise("ex02")
    check.soft_attention_weights(soft_attention_weights)   # one PASS/FAIL line per case
    check.hint("soft_attention_weights")
    check.progress()

For a folder of submissions: ``python -m attention_course.grading PATH... [--csv OUT] [--json OUT]``.
Learner notebooks are generated from the solution notebooks with
``python -m attention_course.grading.generate``. ``exercises/README.md`` is the authoring guide.
"""

from attention_course.grading.checker import Checker, exercise
from attention_course.grading.exercises import exercise_ids, get_exercise
from attention_course.grading.spec import Case, Exercise, Part

__all__ = ["Case", "Checker", "Exercise", "Part", "exercise", "exercise_ids", "get_exercise"]
