"""Grading reports: a table for the terminal, JSON and CSV for spreadsheets and scripts."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path

from attention_course.grading.grader import NotebookResult

__all__ = ["format_table", "to_json", "to_csv", "part_columns"]


def part_columns(results: Sequence[NotebookResult]) -> list[str]:
    """One CSV column per ``exercise:part`` seen, in order of first appearance."""
    columns: list[str] = []
    for result in results:
        for verdict in result.parts:
            column = f"{result.exercise}:{verdict.part}"
            if column not in columns:
                columns.append(column)
    return columns


def format_table(results: Sequence[NotebookResult], details: bool = True) -> str:
    """A summary table (one row per notebook), then each notebook's parts with their messages."""
    if not results:
        return "no notebooks graded"
    width = max(len("notebook"), *(len(r.path) for r in results))
    lines = [f"{'notebook':<{width}}  {'exercise':<10} {'score':>7}  parts passed"]
    for r in results:
        passed = sum(v.passed for v in r.parts)
        lines.append(f"{r.path:<{width}}  {r.exercise or '-':<10} {f'{r.score}/{r.max_score}':>7}  "
                     f"{passed}/{len(r.parts)}" + (f"  {r.message}" if r.message and not r.parts else ""))
    if details:
        for r in results:
            lines.append("")
            lines.append(f"{r.path}: {r.score}/{r.max_score}" + (f" ({r.message})" if r.message else ""))
            name_width = max((len(v.part) for v in r.parts), default=0)
            for v in r.parts:
                lines.append(f"  {v.part:<{name_width}}  {v.score}/{v.max_score}  {v.message}")
    return "\n".join(lines)


def to_json(results: Sequence[NotebookResult]) -> str:
    return json.dumps({"notebooks": [r.to_dict() for r in results]}, indent=2) + "\n"


def to_csv(results: Sequence[NotebookResult]) -> str:
    """One row per notebook: path, exercise, score, max_score, message, then one column per part (its
    score; empty when the notebook has no such part)."""
    columns = part_columns(results)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["path", "exercise", "score", "max_score", "message", *columns])
    for r in results:
        scores = {f"{r.exercise}:{v.part}": v.score for v in r.parts}
        writer.writerow([r.path, r.exercise or "", r.score, r.max_score, r.message,
                         *(scores.get(column, "") for column in columns)])
    return buffer.getvalue()


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
