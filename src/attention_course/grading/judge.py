"""Turn the outcomes of the learner's calls into verdicts: one per case, one per part.

Used by the notebook check and by the grader alike, so both give the same verdict on the same output.
Judging never trusts the learner's process: it receives only wire-form outcomes
(:mod:`attention_course.grading.wire`) and calls the part's ``verify`` on the inputs it generated itself.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from attention_course.grading.findings import FailureKind, Finding, kind_of
from attention_course.grading.spec import Case, Part
from attention_course.grading.wire import is_wire

__all__ = ["CaseVerdict", "FailureKind", "PartVerdict", "judge_case", "judge_part", "failed_part"]

# Part statuses
PASSED = "passed"
FAILED = "failed"
NOT_ATTEMPTED = "not attempted"


@dataclass(frozen=True)
class CaseVerdict:
    """The verdict on one case: ``message`` is ``None`` for a pass; ``kind`` says why it failed (taken from
    the message when it is a :class:`~attention_course.grading.findings.Finding`), ``None`` for a pass."""

    name: str
    message: str | None
    credit: bool = True  # counts for proportional credit (see Case.credit)
    kind: FailureKind | None = None

    def __post_init__(self) -> None:
        if self.message is None:
            object.__setattr__(self, "kind", None)
        elif self.kind is None:
            object.__setattr__(self, "kind", kind_of(self.message))

    @property
    def passed(self) -> bool:
        return self.message is None


@dataclass(frozen=True)
class PartVerdict:
    """The verdict on one part: its points in proportion to the cases passed (all or nothing when
    ``all_or_nothing``, an instructor's option).

    ``message`` summarises the part in one line (what the grader's report shows); ``cases`` holds the
    per-case verdicts (empty when the part could not run at all: missing cell, timeout, crash); ``cause``
    names an earlier part of the learner's own code that fails and that this part calls; ``kind`` says why
    the part failed (its first failing case's kind, or why it could not be judged), ``None`` when it passed.
    """

    part: str
    max_score: int
    status: str
    message: str
    cases: tuple[CaseVerdict, ...] = field(default=())
    all_or_nothing: bool = False
    cause: str = ""
    kind: FailureKind | None = None

    @property
    def score(self) -> float:
        if self.status == PASSED:
            return self.max_score
        counted = [case for case in self.cases if case.credit]  # degenerate cases earn nothing on their own
        if self.all_or_nothing or self.status == NOT_ATTEMPTED or not counted:
            return 0
        fraction = sum(case.passed for case in counted) / len(counted)
        score = round(self.max_score * fraction, 2)
        return int(score) if score == int(score) else score

    @property
    def passed(self) -> bool:
        return self.status == PASSED


#: PyTorch's shape errors, and what each means in plain words (the groups are the sizes it names).
_SHAPE_ERRORS = (
    (re.compile(r"Sizes of tensors must match except in dimension (-?\d+)\. Expected size (\d+) but got size (\d+)"),
     lambda m: (f"you joined tensors (torch.cat or torch.stack) along dimension {m[1]}, but they must agree in "
                f"every other dimension, and one has size {m[2]} where another has size {m[3]}: check which "
                f"dimension you join along")),
    (re.compile(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)"),
     lambda m: (f"you multiplied a ({m[1]}, {m[2]}) matrix by a ({m[3]}, {m[4]}) matrix: the first one's last "
                f"size ({m[2]}) must equal the second one's first size ({m[3]}); is one of them transposed?")),
    (re.compile(r"Expected size for first two dimensions of batch2 tensor to be: \[(\d+), (\d+)\] but got: "
                r"\[(\d+), (\d+)\]"),
     lambda m: (f"in a batched matrix product the second tensor's batch and row sizes must be ({m[1]}, {m[2]}), "
                f"yours are ({m[3]}, {m[4]}): the first one's last size must equal the second one's "
                f"second-to-last size; is one of them transposed?")),
    (re.compile(r"The size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) at non-singleton "
                r"dimension (\d+)"),
     lambda m: (f"you combined two tensors element by element whose dimension {m[3]} (counted from the right "
                f"end's alignment) has sizes {m[1]} and {m[2]}: sizes must be equal, or one of them 1, to broadcast")),
    (re.compile(r"shape '\[([-\d, ]*)\]' is invalid for input of size (\d+)"),
     lambda m: f"you reshaped (view or reshape) {m[2]} numbers into the shape ({m[1]}), which does not hold {m[2]}"),
    (re.compile(r"The expanded size of the tensor \((\d+)\) must match the existing size \((\d+)\).*Target "
                r"sizes: \[([-\d, ]*)\]\.\s+Tensor sizes: \[([-\d, ]*)\]"),
     lambda m: f"you expanded a tensor of shape ({m[4]}) to ({m[3]}): only dimensions of size 1 can grow"),
)


def _shapes(value: Any, depth: int = 0) -> list[str]:
    if isinstance(value, torch.Tensor):
        return [str(tuple(value.shape))]
    if depth < 2 and isinstance(value, (list, tuple)):
        return [shape for item in value for shape in _shapes(item, depth + 1)]
    return []


def shape_words(message: str, case: Any = None) -> str | None:
    """A PyTorch shape error ``message`` explained in plain words, with the shapes of the tensors the case
    passes (in argument order), or ``None`` when it is not a shape error."""
    for pattern, explain in _SHAPE_ERRORS:
        found = pattern.search(message)
        if found:
            words = f"shapes do not fit: {explain(found)}"
            given = [shape for arg in getattr(case, "args", ()) for shape in _shapes(arg)]
            if given:
                words += f". This case gives your function tensors of shapes {', '.join(given)} (in argument order)"
            return words
    return None


#: The exceptions the grader's own refusals raise in the learner's process (the library rule, a PyTorch routine
#: a part may not call, the import guard): a failure for a forbidden call, not an ordinary error.
_REFUSALS = frozenset({"LibraryRuleError", "TorchRMSNormRefused", "FrameAccessRefused", "PermissionError"})


def error_kind(outcome: dict[str, Any]) -> FailureKind:
    """The kind of an ``error`` outcome: a refusal by the grader's rules, or an error of the learner's code."""
    kind, text = str(outcome.get("type", "")), str(outcome.get("message", ""))
    if kind in _REFUSALS or (kind == "ImportError" and "graded code" in text):
        return FailureKind.FORBIDDEN
    return FailureKind.ERROR_RAISED


def _error_message(outcome: dict[str, Any], case: Any = None) -> Finding:
    return Finding(_error_words(outcome, case), error_kind(outcome))


def _error_words(outcome: dict[str, Any], case: Any = None) -> str:
    kind = str(outcome.get("type", "an error"))
    text = str(outcome.get("message", "")).strip()
    where = str(outcome.get("where", "")).strip()
    words = shape_words(text, case) if kind == "RuntimeError" else None
    if words:
        return f"{words} (your code raised {kind}: {text[:300]}" + (f"; {where})" if where else ")")
    message = f"your code raised {kind}" + (f": {text}" if text else "")
    return message + (f" ({where})" if where else "")


def judge_case(part: Part, case: Case, outcome: Any) -> CaseVerdict:
    """The verdict on one outcome; never raises, whatever the outcome holds."""
    credit = getattr(case, "credit", True) is not False
    if not isinstance(outcome, dict) or outcome.get("status") not in ("ok", "error", "not_implemented"):
        return CaseVerdict(case.name, "no result came back for this case", credit, FailureKind.NO_RESULT)
    if outcome["status"] == "not_implemented":
        return CaseVerdict(case.name, "your function raises NotImplementedError (not written yet)", credit,
                           FailureKind.NOT_IMPLEMENTED)
    if outcome["status"] == "error":
        return CaseVerdict(case.name, _error_message(outcome, case), credit)
    value = outcome.get("value")
    if not is_wire(value):
        return CaseVerdict(case.name, "your output could not be read", credit, FailureKind.NO_RESULT)
    try:
        message = part.verify(case, value)
    except Exception as exc:  # a verify that trips on an odd output must not crash the checking
        message = Finding(f"your output could not be checked ({type(exc).__name__}: {exc})", FailureKind.TYPE)
    return CaseVerdict(case.name, message, credit)


def judge_part(part: Part, cases: Sequence[Case], outcomes: Sequence[Any]) -> PartVerdict:
    """Judge every case of ``part``; a part passes only if all its cases do."""
    if len(outcomes) != len(cases):
        return failed_part(part, f"expected results for {len(cases)} cases, got {len(outcomes)}",
                           kind=FailureKind.NO_RESULT)
    if outcomes and all(isinstance(o, dict) and o.get("status") == "not_implemented" for o in outcomes):
        return PartVerdict(part.name, part.points, NOT_ATTEMPTED,
                           "not attempted yet: your function still raises NotImplementedError",
                           kind=FailureKind.NOT_IMPLEMENTED)
    verdicts = tuple(judge_case(part, case, outcome) for case, outcome in zip(cases, outcomes))
    failures = [v for v in verdicts if not v.passed]
    if not failures:
        return PartVerdict(part.name, part.points, PASSED, f"all {len(verdicts)} cases passed", verdicts)
    first = failures[0]
    message = f"failed {len(failures)} of {len(verdicts)} cases; first: {first.name}: {first.message}"
    return PartVerdict(part.name, part.points, FAILED, message, verdicts, kind=first.kind)


def failed_part(part: Part, message: str, status: str = FAILED, kind: FailureKind | None = None) -> PartVerdict:
    """A part that could not be judged case by case (missing cell or function, timeout, crash); ``kind`` says
    why (default: the message's own kind, ``FailureKind.OTHER`` for a plain
    string)."""
    return PartVerdict(part.name, part.points, status, message, kind=kind or kind_of(message))
