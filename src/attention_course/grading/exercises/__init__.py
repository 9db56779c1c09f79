"""The exercises the course grades: one module per exercise notebook.

A module ``<id>.py`` in this package (``ex02.py``, ``bug_hunt.py``, ...) defines ``EXERCISE``, an
:class:`~attention_course.grading.spec.Exercise` whose ``id`` equals the module name: the exercise's one
registered unit, holding its parts (each with its cases, check, hints and points), the chapters it practises
and the course-library names each part may use. Modules are found automatically: adding a file is all it
takes to make ``exercise("<id>")`` and the grader know it. Most parts' checks are declared as data
(:class:`attention_course.grading.declare.Check`: a reference, an output spec, properties and a table of
known mistakes); free-form ``verify`` code remains for unusual parts.
"""

from __future__ import annotations

import importlib
import pkgutil

from attention_course.grading.spec import Exercise

__all__ = ["exercise_ids", "get_exercise"]


def exercise_ids() -> list[str]:
    """The ids of all exercises, sorted."""
    return sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))


def get_exercise(exercise_id: str) -> Exercise:
    """The exercise called ``exercise_id``.

    Raises:
        ValueError: no such exercise (the message lists the known ones).
    """
    if not isinstance(exercise_id, str) or exercise_id not in exercise_ids():
        raise ValueError(f"unknown exercise {exercise_id!r}; known exercises: {exercise_ids()}")
    module = importlib.import_module(f"{__name__}.{exercise_id}")
    found = getattr(module, "EXERCISE", None)
    if not isinstance(found, Exercise) or found.id != exercise_id:
        raise ValueError(f"module {module.__name__} must define EXERCISE = Exercise(id={exercise_id!r}, ...)")
    return found
