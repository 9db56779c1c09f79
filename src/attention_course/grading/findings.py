"""Typed verdicts: why a case or a part failed, as a :class:`FailureKind`, kept apart from the message.

The message is for the learner ("row 2 of your weights sums to 0.73"); the kind is for the machinery that
counts, sorts and reports failures (the class summary's most common reasons, the grader's JSON, tests that
a mutant fails for the reason it should). A check returns a :class:`Finding`: a ``str`` (so every place that
reads a message keeps working) that also carries its kind. A plain ``str`` from free-form verify code reads
as ``FailureKind.OTHER``.
"""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["FailureKind", "Finding", "finding", "kind_of"]


class FailureKind(str, enum.Enum):
    """Why a case (or a part that could not be judged case by case) failed."""

    NOT_IMPLEMENTED = "not implemented"  # the function still raises NotImplementedError
    ERROR_RAISED = "error raised"  # the learner's code raised an exception
    TIME_LIMIT = "time limit"  # the function did not return in time
    IN_PLACE = "in-place change"  # the function changed one of its inputs in place
    FORBIDDEN = "forbidden call"  # a library name or a PyTorch routine the part may not use
    MISSING = "missing"  # no graded cell, no function of that name, a cell that raised before defining it
    CHECK_EDITED = "check edited"  # the part's check cell was edited or deleted
    NO_RESULT = "no result"  # nothing (or nothing readable) came back for the case
    TYPE = "type"  # not a tensor, not a tuple of the right length, not a number
    SHAPE = "shape"  # a tensor of the wrong shape
    DTYPE = "dtype"  # a tensor of the wrong dtype (an integer tensor, float32 for a float64 input)
    NOT_FINITE = "not finite"  # a NaN or an infinity where none belongs
    PROPERTY = "property"  # a property of every right answer fails (rows sum to one, invariance, bounds)
    KNOWN_MISTAKE = "known mistake"  # the output equals a known wrong answer (a table of mistakes recognised it)
    EXPECTED_ERROR = "expected error"  # a case that must raise a ValueError did not (or raised another)
    MISMATCH = "mismatch"  # the output differs from the reference
    OTHER = "other"  # a message from free-form verify code that did not say its kind


class Finding(str):
    """A learner-facing message that also says its :class:`FailureKind` (``finding.kind``)."""

    kind: FailureKind

    def __new__(cls, message: str, kind: FailureKind) -> Finding:
        self = super().__new__(cls, message)
        self.kind = kind
        return self

    def __add__(self, other: str) -> Finding:  # an amended message keeps its kind
        return Finding(str(self) + other, self.kind)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Finding, (str(self), self.kind))


def finding(message: str | None, kind: FailureKind) -> Finding | None:
    """``message`` typed as ``kind`` (``None`` stays ``None``: the check passed). A message that already
    has a kind keeps it: the more specific check that produced it knew better."""
    if message is None:
        return None
    return message if isinstance(message, Finding) else Finding(message, kind)


def kind_of(message: Any) -> FailureKind:
    """The kind a message carries; ``FailureKind.OTHER`` for a plain string."""
    return message.kind if isinstance(message, Finding) else FailureKind.OTHER
