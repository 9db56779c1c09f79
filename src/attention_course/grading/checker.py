"""The check object a notebook uses: ``check = exercise("ex02")``, then ``check.<part>(my_function)``.

Each check runs the learner's function on fresh random inputs plus fixed edge cases, judges every output
against references and properties, and prints one line per case, a result line and a progress line. It
never raises because of the learner's code (a ``NotImplementedError`` reads "not attempted yet").

This in-notebook check is feedback, run in the learner's own kernel; the instructor's grader
(:mod:`attention_course.grading.grader`) runs the same parts in a separate process and does not trust
anything the notebook prints.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch

from attention_course.grading.exercises import get_exercise
from attention_course.grading.feedback import format_hint, format_overview, format_part, format_progress
from attention_course.grading.judge import PartVerdict, failed_part, judge_part
from attention_course.grading.spec import Exercise, Part
from attention_course.grading.wire import describe, outcome_of_call

__all__ = ["Checker", "exercise"]


def _fresh_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") & (2**63 - 1)


class Checker:
    """Checks for one exercise; each part is a method: ``check.soft_attention_weights(fn, hint=False)``.

    Args:
        exercise: the exercise whose parts to check.
        seed: seed for the random cases; by default a fresh one on every call, so that an answer written
            to fit one set of inputs cannot pass.
    """

    def __init__(self, exercise: Exercise, seed: int | None = None) -> None:
        self._exercise = exercise
        self._seed = seed
        self._verdicts: dict[str, PartVerdict] = {}

    # --- one method per part ------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            self._exercise.part(name)
        except KeyError:
            raise AttributeError(
                f"{self._exercise.id} has no part {name!r}; its parts are "
                f"{[part.name for part in self._exercise.parts]}"
            ) from None
        return functools.partial(self.check, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | {part.name for part in self._exercise.parts})

    def check(self, part_name: str, obj: Any, hint: bool = False) -> None:
        """Run part ``part_name``'s cases on ``obj`` (the learner's function or class) and print the report."""
        part = self._exercise.part(part_name)
        verdict = self._judge(part, obj)
        self._verdicts[part.name] = verdict
        print(format_part(self._exercise, part, verdict, hint=hint))
        print(format_progress(self._exercise, self._verdicts))

    def _judge(self, part: Part, obj: Any) -> PartVerdict:
        if not callable(obj):
            return failed_part(part, f"expected your function `{part.function}` itself, got {describe(obj)}; "
                                     f"call check.{part.name}({part.function})")
        seed = self._seed if self._seed is not None else _fresh_seed()
        cases = part.make_cases(torch.Generator().manual_seed(seed))
        outcomes = [outcome_of_call(functools.partial(part.run, obj, case)) for case in cases]
        return judge_part(part, cases, outcomes)

    # --- help and progress --------------------------------------------------------------------------
    def hint(self, part_name: str) -> None:
        """Print the hint for part ``part_name``."""
        print(format_hint(self._exercise.part(part_name)))

    def progress(self) -> None:
        """Print every part with its status, and the points so far."""
        print(format_overview(self._exercise, self._verdicts))

    def passed(self, part_name: str) -> bool:
        """Whether the last check of ``part_name`` passed."""
        verdict = self._verdicts.get(self._exercise.part(part_name).name)
        return verdict is not None and verdict.passed

    def assert_all_passed(self) -> None:
        """Raise ``AssertionError`` naming the parts not passed (solution notebooks end with this)."""
        missing = [part.name for part in self._exercise.parts if not self.passed(part.name)]
        if missing:
            raise AssertionError(f"{self._exercise.id}: parts not passed (or not checked): {missing}")
        print(f"All {len(self._exercise.parts)} parts of {self._exercise.id} pass.")

    def __repr__(self) -> str:
        return format_overview(self._exercise, self._verdicts)


def exercise(exercise_id: str, seed: int | None = None) -> Checker:
    """The checks for exercise ``exercise_id`` (e.g. ``"ex02"``, ``"bug_hunt"``).

    Example:
        >>> check = exercise("ex02")
        >>> check.soft_attention_weights(soft_attention_weights)   # doctest: +SKIP
    """
    checker = Checker(get_exercise(exercise_id), seed=seed)
    ex = checker._exercise
    print(f"Checks for {ex.id} ({ex.title}) are ready: {len(ex.parts)} parts, {ex.max_score} points. "
          f"Run check.progress() at any time.")
    return checker
