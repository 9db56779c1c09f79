"""What an exercise is made of: parts, and the test cases each part runs.

An :class:`Exercise` (one per exercise notebook) lists its :class:`Part` objects in notebook order. A part
names the function the learner writes and knows three things:

- ``make_cases(generator)``: the inputs to try (fresh random ones each run plus fixed edge cases), as
  :class:`Case` objects. A case holds **inputs only**: it travels to the learner's process, so it must
  never carry the expected answer.
- ``run(obj, case)``: how to call the learner's function (or build the learner's class) on one case. It
  runs in the learner's process, so it only calls and returns, it never judges.
- ``verify(case, output)``: the verdict on one case, computed in the checking process from the case's
  inputs (references from PyTorch or the library, and properties): ``None`` for a pass, else a specific
  message such as ``"row 2 of your weights sums to 0.73"``.

The notebook check (:mod:`attention_course.grading.checker`) and the grader
(:mod:`attention_course.grading.grader`) both use these three functions, so a learner sees in the notebook
exactly the verdicts the instructor's grader will give.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Case", "Part", "Exercise", "call_function", "randn"]


@dataclass
class Case:
    """One input to try on the learner's function.

    Attributes:
        name: what the learner reads in the report, e.g. ``"scores ~ 1e4 (overflow test)"``. Keep random
            values out of it, so that a correct solution prints the same text on every run.
        args: positional arguments for the learner's function.
        kwargs: keyword arguments for the learner's function.
        data: anything else ``run`` or ``verify`` need (sizes, a state dict to load, a seed). Inputs only:
            this travels to the learner's process too.
    """

    name: str
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)

    def fresh_args(self) -> tuple[tuple, dict[str, Any]]:
        """Deep copies of ``args`` and ``kwargs``, so that a function that edits its inputs in place cannot
        change the inputs ``verify`` later computes the reference from."""
        return copy.deepcopy(self.args), copy.deepcopy(self.kwargs)


def randn(g: torch.Generator, *shape: int, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A case input: standard normal numbers of ``shape`` drawn from ``g``, times ``scale``."""
    return torch.randn(*shape, generator=g, dtype=dtype) * scale


def call_function(obj: Callable[..., Any], case: Case) -> Any:
    """The default ``Part.run``: ``obj(*case.args, **case.kwargs)`` on fresh copies of the inputs."""
    args, kwargs = case.fresh_args()
    return obj(*args, **kwargs)


@dataclass(frozen=True)
class Part:
    """One graded part of an exercise: the learner writes ``function`` in a cell tagged ``graded``.

    Attributes:
        name: the part's id: the check method (``check.<name>(...)``), the ``grading.part`` metadata of its
            cells, and its column in the grader's CSV. A Python identifier.
        function: the name of the function (or class) the learner's cell defines.
        points: marks for the part; a part scores all of them only if every case passes.
        summary: one line saying what the function does, shown in progress listings.
        hint: printed by ``check.hint(name)``.
        make_cases: ``generator -> list[Case]``; draw every random number from ``generator``.
        verify: ``(case, output) -> message or None``; ``output`` is in wire form
            (:func:`attention_course.grading.wire.to_wire`): tensors, numbers, strings, lists, tuples, dicts.
        run: ``(learner object, case) -> output``, run in the learner's process (default: call it).
    """

    name: str
    function: str
    points: int
    summary: str
    hint: str
    make_cases: Callable[[torch.Generator], list[Case]]
    verify: Callable[[Case, Any], str | None]
    run: Callable[[Any, Case], Any] = call_function

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"part name must be a Python identifier, got {self.name!r}")
        if not self.function.isidentifier():
            raise ValueError(f"function name must be a Python identifier, got {self.function!r}")
        if not isinstance(self.points, int) or self.points < 1:
            raise ValueError(f"points must be a positive int, got {self.points!r}")


@dataclass(frozen=True)
class Exercise:
    """A graded exercise notebook: its id, title, trusted preamble and parts.

    Attributes:
        id: the exercise id used in ``exercise("ex02")`` and in the notebook's metadata
            (``metadata.grading.exercise``).
        title: the notebook's title.
        preamble: Python source the grader runs before the learner's graded cells: the imports the graded
            code may rely on. The notebook's cell tagged ``preamble`` must hold exactly this source (a test
            checks it), so the notebook and the grader agree; the grader never runs the learner's copy.
        parts: the graded parts, in notebook order.
    """

    id: str
    title: str
    preamble: str
    parts: tuple[Part, ...]

    def __post_init__(self) -> None:
        names = [part.name for part in self.parts]
        if len(set(names)) != len(names):
            raise ValueError(f"exercise {self.id!r} has duplicate part names: {names}")
        functions = [part.function for part in self.parts]
        if len(set(functions)) != len(functions):
            raise ValueError(f"exercise {self.id!r} has parts sharing a function name: {functions}")

    @property
    def max_score(self) -> int:
        return sum(part.points for part in self.parts)

    def part(self, name: str) -> Part:
        """The part called ``name``; ``KeyError`` naming the known parts otherwise."""
        for part in self.parts:
            if part.name == name:
                return part
        raise KeyError(f"exercise {self.id!r} has no part {name!r}; its parts are {[p.name for p in self.parts]}")


def call_expecting_error(obj: Any, case: Case) -> Any:
    """Call the learner's object; for a case that demands an error (``"error"`` in ``case.data``), report what
    it raised or returned as plain data, judged by :func:`~attention_course.grading.compare.value_error_problem`.
    Other cases are called as usual."""
    if "error" not in case.data:
        return call_function(obj, case)
    args, kwargs = case.fresh_args()
    try:
        returned = obj(*args, **kwargs)
    except NotImplementedError:
        raise
    except Exception as exc:  # what was raised is the answer here; verify gives the verdict
        return {"raised": type(exc).__name__, "message": str(exc)}
    return {"returned": returned}
