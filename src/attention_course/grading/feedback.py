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


def _wrap(text: str, indent: str, subsequent: str | None = None) -> str:
    """``text`` filled to the report's width: the first line starts with ``indent``, the others with
    ``subsequent`` (default: ``indent`` and six spaces)."""
    return textwrap.fill(text, width=_WIDTH, initial_indent=indent,
                         subsequent_indent=indent + "      " if subsequent is None else subsequent,
                         break_long_words=False, break_on_hyphens=False)


def _header(exercise: Exercise, part: Part) -> str:
    index = [p.name for p in exercise.parts].index(part.name) + 1
    points = f"{part.points} point{'s' if part.points != 1 else ''}"
    return f"{exercise.id} part {index} of {len(exercise.parts)}: {part.name} ({points})"


def _points(score: float) -> str:
    return f"{score:g}"


def format_part(exercise: Exercise, part: Part, verdict: PartVerdict, hint: bool = False) -> str:
    """The report a check prints: a header, the cause when an earlier part is to blame, one PASS/FAIL line
    per case, a result line, and the hint if asked for (or a pointer to it when something failed)."""
    lines = [_header(exercise, part)]
    if verdict.cause:
        lines.append(_wrap(f"First: {verdict.cause}.", "  "))
    if verdict.status == NOT_ATTEMPTED:
        lines.append(_wrap(f"Not attempted yet: `{part.function}` still raises NotImplementedError. Write your "
                           "code in its cell, run that cell, then run this check again.", "  "))
    else:
        for case in verdict.cases:
            mark = "" if case.credit else " (no credit on its own)"
            line = f"PASS  {case.name}{mark}" if case.passed else f"FAIL  {case.name}{mark}: {case.message}"
            lines.append(_wrap(line, "  "))
        if not verdict.cases:
            message = verdict.message
            if verdict.cause and message.startswith(verdict.cause):
                message = message[len(verdict.cause):].lstrip(". ")
            lines.append(_wrap(f"FAIL  {message}", "  "))
        passed = sum(case.passed for case in verdict.cases)
        result = (f"Passed: all {len(verdict.cases)} cases, {_points(verdict.score)} of {verdict.max_score} points."
                  if verdict.passed else
                  f"Not yet: {passed} of {len(verdict.cases)} cases passed, {_points(verdict.score)} of "
                  f"{verdict.max_score} points.")
        lines.append("  " + result)
        unpaid = sum(case.passed and not case.credit for case in verdict.cases)
        if unpaid and not verdict.passed and not verdict.all_or_nothing:
            which = "1 of the passed cases earns" if unpaid == 1 else f"{unpaid} of the passed cases each earn"
            lines.append(_wrap(f"({which} nothing on its own: its input hides a known mistake (one key hides a "
                               "missing scale, no mask a wrong mask), so wrong answers pass it too.)", "  ", "  "))
    if hint:
        lines.append(format_hint(part))
    elif not verdict.passed:
        lines.append(f'  Stuck? Run check.hint("{part.name}") for a hint, check.hint("{part.name}", 2) for '
                     "the approach.")
    return "\n".join(lines)


def format_hint(part: Part, level: int = 1) -> str:
    """Hint ``level`` of ``part`` (1: the concept, 2: the approach), or a line saying which levels exist."""
    tiers = part.hints
    if not tiers:
        return f"  No hint for {part.name}."
    if not isinstance(level, int) or not 1 <= level <= len(tiers):
        return f"  {part.name} has hint levels 1 to {len(tiers)}: check.hint(\"{part.name}\", 1) ... "
    label = ("Hint (concept): " if len(tiers) > 1 else "Hint: ") if level == 1 else f"Hint {level} (approach): "
    pad = "  " + " " * len(label)  # the label once, on the first line; the text aligned under it
    text = "\n".join(_wrap(paragraph, "  " + label if i == 0 else pad, pad)
                     for i, paragraph in enumerate(tiers[level - 1].split("\n\n")))
    if level < len(tiers):
        text += f'\n  More: check.hint("{part.name}", {level + 1})'
    return text


def format_progress(exercise: Exercise, verdicts: Mapping[str, PartVerdict]) -> str:
    """'Progress: 2 of 5 parts passed, 3.5 of 9 points (ex02).'"""
    passed = [name for name, verdict in verdicts.items() if verdict.passed]
    score = sum(verdict.score for verdict in verdicts.values())
    return (f"Progress: {len(passed)} of {len(exercise.parts)} parts passed, "
            f"{_points(score)} of {exercise.max_score} points ({exercise.id}).")


def format_overview(exercise: Exercise, verdicts: Mapping[str, PartVerdict]) -> str:
    """A list of all parts with their status: what ``check.progress()`` prints."""
    lines = [f"{exercise.id}: {exercise.title}"]
    for index, part in enumerate(exercise.parts, start=1):
        verdict = verdicts.get(part.name)
        status = "not checked yet" if verdict is None else verdict.status
        lines.append(f"  {index}. {part.name} ({part.points} pt): {status}. {part.summary}")
    lines.append(format_progress(exercise, verdicts))
    return "\n".join(lines)
