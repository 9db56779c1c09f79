"""Turn the outcomes of the learner's calls into verdicts: one per case, one per part.

Used by the notebook check and by the grader alike, so both give the same verdict on the same output.
Judging never trusts the learner's process: it receives only wire-form outcomes
(:mod:`attention_course.grading.wire`) and calls the part's ``verify`` on the inputs it generated itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from attention_course.grading.spec import Case, Part
from attention_course.grading.wire import is_wire

__all__ = ["CaseVerdict", "PartVerdict", "judge_case", "judge_part", "failed_part"]

# Part statuses
PASSED = "passed"
FAILED = "failed"
NOT_ATTEMPTED = "not attempted"


@dataclass(frozen=True)
class CaseVerdict:
    """The verdict on one case: ``message`` is ``None`` for a pass."""

    name: str
    message: str | None
    credit: bool = True  # counts for proportional credit (see Case.credit)

    @property
    def passed(self) -> bool:
        return self.message is None


@dataclass(frozen=True)
class PartVerdict:
    """The verdict on one part: its points in proportion to the cases passed (all or nothing when
    ``all_or_nothing``, an instructor's option).

    ``message`` summarises the part in one line (what the grader's report shows); ``cases`` holds the
    per-case verdicts (empty when the part could not run at all: missing cell, timeout, crash); ``cause``
    names an earlier part of the learner's own code that fails and that this part calls.
    """

    part: str
    max_score: int
    status: str
    message: str
    cases: tuple[CaseVerdict, ...] = field(default=())
    all_or_nothing: bool = False
    cause: str = ""

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


def _error_message(outcome: dict[str, Any]) -> str:
    kind = str(outcome.get("type", "an error"))
    text = str(outcome.get("message", "")).strip()
    where = str(outcome.get("where", "")).strip()
    message = f"your code raised {kind}" + (f": {text}" if text else "")
    return message + (f" ({where})" if where else "")


def judge_case(part: Part, case: Case, outcome: Any) -> CaseVerdict:
    """The verdict on one outcome; never raises, whatever the outcome holds."""
    credit = getattr(case, "credit", True) is not False
    if not isinstance(outcome, dict) or outcome.get("status") not in ("ok", "error", "not_implemented"):
        return CaseVerdict(case.name, "no result came back for this case", credit)
    if outcome["status"] == "not_implemented":
        return CaseVerdict(case.name, "your function raises NotImplementedError (not written yet)", credit)
    if outcome["status"] == "error":
        return CaseVerdict(case.name, _error_message(outcome), credit)
    value = outcome.get("value")
    if not is_wire(value):
        return CaseVerdict(case.name, "your output could not be read", credit)
    try:
        message = part.verify(case, value)
    except Exception as exc:  # a verify that trips on an odd output must not crash the checking
        message = f"your output could not be checked ({type(exc).__name__}: {exc})"
    return CaseVerdict(case.name, message, credit)


def judge_part(part: Part, cases: Sequence[Case], outcomes: Sequence[Any]) -> PartVerdict:
    """Judge every case of ``part``; a part passes only if all its cases do."""
    if len(outcomes) != len(cases):
        return failed_part(part, f"expected results for {len(cases)} cases, got {len(outcomes)}")
    if outcomes and all(isinstance(o, dict) and o.get("status") == "not_implemented" for o in outcomes):
        return PartVerdict(part.name, part.points, NOT_ATTEMPTED,
                           "not attempted yet: your function still raises NotImplementedError")
    verdicts = tuple(judge_case(part, case, outcome) for case, outcome in zip(cases, outcomes))
    failures = [v for v in verdicts if not v.passed]
    if not failures:
        return PartVerdict(part.name, part.points, PASSED, f"all {len(verdicts)} cases passed", verdicts)
    first = failures[0]
    message = f"failed {len(failures)} of {len(verdicts)} cases; first: {first.name}: {first.message}"
    return PartVerdict(part.name, part.points, FAILED, message, verdicts)


def failed_part(part: Part, message: str, status: str = FAILED) -> PartVerdict:
    """A part that could not be judged case by case (missing cell or function, timeout, crash)."""
    return PartVerdict(part.name, part.points, status, message)
