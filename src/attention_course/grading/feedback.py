"""Plain-text reports for the notebook: one line per case, a result line, a progress line.

Plain text reads the same in Jupyter, Colab, VS Code and on the website, and survives copy and paste
into a forum post.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping

from attention_course.grading.judge import NOT_ATTEMPTED, PartVerdict
from attention_course.grading.spec import Exercise, Part

__all__ = ["format_part", "format_progress", "format_hint", "format_overview"]

_WIDTH = 100


def _wrap(text: str, indent: str) -> str:
    return textwrap.fill(text, width=_WIDTH, initial_indent=indent, subsequent_indent=indent + "      ",
                         break_long_words=False, break_on_hyphens=False)


def _header(exercise: Exercise, part: Part) -> str:
    index = [p.name for p in exercise.parts].index(part.name) + 1
    points = f"{part.points} point{'s' if part.points != 1 else ''}"
    return f"{exercise.id} part {index} of {len(exercise.parts)}: {part.name} ({points})"


def format_part(exercise: Exercise, part: Part, verdict: PartVerdict, hint: bool = False) -> str:
    """The report a check prints: a header, one PASS/FAIL line per case, a result line, and the hint if
    asked for (or a pointer to it when something failed)."""
    lines = [_header(exercise, part)]
    if verdict.status == NOT_ATTEMPTED:
        lines.append(_wrap(f"Not attempted yet: `{part.function}` still raises NotImplementedError. Write your "
                           "code in its cell, run that cell, then run this check again.", "  "))
    else:
        for case in verdict.cases:
            lines.append(_wrap(f"PASS  {case.name}" if case.passed else f"FAIL  {case.name}: {case.message}", "  "))
        if not verdict.cases:
            lines.append(_wrap(f"FAIL  {verdict.message}", "  "))
        passed = sum(case.passed for case in verdict.cases)
        result = (f"Passed: all {len(verdict.cases)} cases, {verdict.score} of {verdict.max_score} points."
                  if verdict.passed else
                  f"Not yet: {passed} of {len(verdict.cases)} cases passed, 0 of {verdict.max_score} points.")
        lines.append("  " + result)
    if hint:
        lines.append(format_hint(part))
    elif not verdict.passed:
        lines.append(f'  Stuck? Run check.hint("{part.name}") for a hint.')
    return "\n".join(lines)


def format_hint(part: Part) -> str:
    return "\n".join(_wrap(paragraph, "  Hint: " if i == 0 else "        ")
                     for i, paragraph in enumerate(part.hint.split("\n\n")))


def format_progress(exercise: Exercise, verdicts: Mapping[str, PartVerdict]) -> str:
    """'Progress: 2 of 5 parts passed, 3 of 9 points (ex02).'"""
    passed = [name for name, verdict in verdicts.items() if verdict.passed]
    score = sum(verdicts[name].score for name in passed)
    return (f"Progress: {len(passed)} of {len(exercise.parts)} parts passed, "
            f"{score} of {exercise.max_score} points ({exercise.id}).")


def format_overview(exercise: Exercise, verdicts: Mapping[str, PartVerdict]) -> str:
    """A list of all parts with their status: what ``check.progress()`` prints."""
    lines = [f"{exercise.id}: {exercise.title}"]
    for index, part in enumerate(exercise.parts, start=1):
        verdict = verdicts.get(part.name)
        status = "not checked yet" if verdict is None else verdict.status
        lines.append(f"  {index}. {part.name} ({part.points} pt): {status}. {part.summary}")
    lines.append(format_progress(exercise, verdicts))
    return "\n".join(lines)
