"""Grading reports: a table for the terminal, JSON and CSV for spreadsheets and scripts, a roster of learners,
a class summary with a histogram, and one feedback file per learner."""

from __future__ import annotations

import csv
import html
import io
import json
import re
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from attention_course.grading.evaluate import CHECK_CELL_EDITED
from attention_course.grading.grader import NotebookResult
from attention_course.grading.judge import PartVerdict

__all__ = ["Roster", "class_summary", "common_failures", "failure_kinds", "failure_reason", "feedback_files",
           "feedback_html", "feedback_markdown", "format_table", "load_roster", "part_columns", "to_csv", "to_json"]


def part_columns(results: Sequence[NotebookResult]) -> list[str]:
    """One CSV column per ``exercise:part`` seen, in order of first appearance."""
    columns: list[str] = []
    for result in results:
        for verdict in result.parts:
            column = f"{result.exercise}:{verdict.part}"
            if column not in columns:
                columns.append(column)
    return columns


def _num(score: float) -> str:
    return f"{score:g}"


def format_table(results: Sequence[NotebookResult], details: bool = True, roster: Roster | None = None) -> str:
    """A summary table (one row per notebook, with the learner's id when a roster names them and the
    seconds it took), then each notebook's parts with their messages."""
    if not results:
        return "no notebooks graded"
    width = max(len("notebook"), *(len(r.path) for r in results))
    ids = {r.path: roster.lookup(r.path)[0] if roster else "" for r in results}
    id_width = max([len(i) for i in ids.values()] + [len("learner") if roster else 0])
    learner = f"{'learner':<{id_width}}  " if roster else ""
    lines = [f"{'notebook':<{width}}  {learner}{'exercise':<10} {'score':>9}  parts passed  seconds"]
    for r in results:
        passed = sum(v.passed for v in r.parts)
        who = f"{ids[r.path]:<{id_width}}  " if roster else ""
        lines.append(f"{r.path:<{width}}  {who}{r.exercise or '-':<10} {f'{_num(r.score)}/{r.max_score}':>9}  "
                     f"{f'{passed}/{len(r.parts)}':<12}  {r.seconds:7.1f}"
                     + (f"  {r.message}" if r.message and not r.parts else ""))
    if details:
        for r in results:
            lines.append("")
            lines.append(f"{r.path}: {_num(r.score)}/{r.max_score}" + (f" ({r.message})" if r.message else ""))
            name_width = max((len(v.part) for v in r.parts), default=0)
            for v in r.parts:
                lines.append(f"  {v.part:<{name_width}}  {_num(v.score)}/{v.max_score}  {v.message}")
    return "\n".join(lines)


def to_json(results: Sequence[NotebookResult], roster: Roster | None = None) -> str:
    entries = []
    for r in results:
        entry = r.to_dict()
        if roster is not None:
            entry["learner_id"], entry["name"] = roster.lookup(r.path)
        entries.append(entry)
    return json.dumps({"notebooks": entries}, indent=2) + "\n"


#: First characters that make a spreadsheet read a cell as a formula (or, tab and CR, hide one after them).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _safe_cell(value: object) -> object:
    """A CSV cell that no spreadsheet runs as a formula: text starting with ``=``, ``+``, ``-``, ``@``, a tab
    or a carriage return gets a leading apostrophe (a file named ``=HYPERLINK(...).ipynb`` stays its name,
    shown as text), and a carriage return anywhere becomes a space; numbers are written as they are."""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        value = "'" + value
    if isinstance(value, str) and "\r" in value:  # Python's csv module leaves a CR unquoted: a broken row
        value = value.replace("\r", " ")
    return value


def to_csv(results: Sequence[NotebookResult], roster: Roster | None = None) -> str:
    """One row per notebook: path, exercise, score, max_score, message, seconds, learner_id, name (from the
    roster, else empty), one column per part with its score (empty when the notebook has no such part),
    then one ``<exercise>:<part> reason`` column per part with the reason it lost marks (empty if passed)."""
    columns = part_columns(results)
    buffer = io.StringIO()
    csv_writer = csv.writer(buffer, lineterminator="\n")

    def writerow(row: list[object]) -> None:
        csv_writer.writerow([_safe_cell(cell) for cell in row])

    writerow(["path", "exercise", "score", "max_score", "message", "seconds", "learner_id", "name",
                     *columns, *(f"{column} reason" for column in columns)])
    for r in results:
        scores = {f"{r.exercise}:{v.part}": _num(v.score) for v in r.parts}
        reasons = {f"{r.exercise}:{v.part}": "" if v.passed else v.message for v in r.parts}
        learner_id, name = roster.lookup(r.path) if roster else ("", "")
        writerow([r.path, r.exercise or "", _num(r.score), r.max_score, r.message, f"{r.seconds:.2f}",
                         learner_id, name, *(scores.get(column, "") for column in columns),
                         *(reasons.get(column, "") for column in columns)])
    return buffer.getvalue()


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


# --- a roster: which learner wrote which notebook -------------------------------------------------------
@dataclass
class Roster:
    """Learners by notebook: rows of ``file`` (a notebook's file name or path) or ``email`` (found in the
    notebook's path, e.g. a folder per learner), a ``learner_id`` and a ``name``."""

    rows: list[dict[str, str]]

    def lookup(self, path: str) -> tuple[str, str]:
        """``(learner_id, name)`` of the notebook at ``path``; ``("", "")`` when no row matches.

        Matches whole path components, never substrings: a row's ``email`` is a folder of the path (the
        outermost one wins: a learner controls only what is inside their own folder, so a subfolder or a
        file named after a classmate inside it changes nothing) or the file's name without ``.ipynb``; a
        row's ``file`` is the path's last components."""
        components = [part.lower() for part in PurePosixPath(str(path).replace("\\", "/")).parts if part != "/"]
        if not components:
            return "", ""
        leaf = components[-1]
        stem = leaf[: -len(".ipynb")] if leaf.endswith(".ipynb") else leaf
        by_email = {row.get("email", "").strip().lower(): row for row in self.rows if row.get("email", "").strip()}
        for folder in components[:-1]:
            if folder in by_email:
                return self._who(by_email[folder])
        if stem in by_email:
            return self._who(by_email[stem])
        for row in self.rows:
            file = [part for part in row.get("file", "").strip().lower().replace("\\", "/").split("/") if part]
            if file and components[-len(file):] == file:
                return self._who(row)
        return "", ""

    @staticmethod
    def _who(row: dict[str, str]) -> tuple[str, str]:
        return row.get("learner_id", "").strip(), row.get("name", "").strip()

    def missing(self, paths: Sequence[str]) -> list[tuple[str, str]]:
        """``(learner_id, name)`` of every learner of the roster whom none of the notebooks at ``paths``
        belongs to (no submission), in roster order."""
        found = {self.lookup(path) for path in paths}
        learners = [self._who(row) for row in self.rows if row.get("learner_id", "").strip()]
        return [who for who in dict.fromkeys(learners) if who not in found]


def load_roster(path: str | Path) -> Roster:
    """Read a roster CSV with a ``learner_id`` column, a ``name`` column (optional), and a ``file`` or an
    ``email`` column (or both).

    Raises:
        ValueError: the file lacks the columns, naming what is missing and what it has.
    """
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        header = [name.strip() for name in reader.fieldnames or []]
        rows = [{(key or "").strip(): (value or "") for key, value in row.items()} for row in reader]
    if "learner_id" not in header or not ({"file", "email"} & set(header)):
        raise ValueError(f"roster {str(path)!r} needs a 'learner_id' column and a 'file' or 'email' column; "
                         f"it has {header}")
    return Roster(rows)


# --- the class as a whole -------------------------------------------------------------------------------
def failure_reason(verdict: PartVerdict) -> str:
    """Why a part lost marks, in one line: its first failed case's message (else the part's message)."""
    failed = [case for case in verdict.cases if not case.passed]
    reason = failed[0].message if failed and failed[0].message else verdict.message
    if verdict.cause and reason.startswith(verdict.cause):
        reason = verdict.cause
    return " ".join(str(reason).split())


def _reason_kind(reason: str) -> str:
    """A reason with its numbers, shapes and quoted values blanked, so that the same mistake on different
    inputs counts once: "row 2 sums to 0.73" and "row 0 sums to 1.4" are one kind."""
    return re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "#", reason)[:200]


def common_failures(verdicts: Sequence[PartVerdict], top: int = 3) -> list[tuple[int, str]]:
    """The ``top`` most common reasons the failed ``verdicts`` give, as ``(count, an example of it)``, most
    common first (ties in order of first appearance)."""
    kinds: Counter[str] = Counter()
    example: dict[str, str] = {}
    for verdict in verdicts:
        if verdict.passed:
            continue
        reason = failure_reason(verdict)
        kind = _reason_kind(reason)
        kinds[kind] += 1
        example.setdefault(kind, reason)
    return [(count, example[kind]) for kind, count in kinds.most_common(top)]


def failure_kinds(verdicts: Sequence[PartVerdict], top: int = 3) -> str:
    """The ``top`` most common failure kinds of the failed ``verdicts`` with their counts, "property 4, shape 1"
    (from the typed verdicts, not from the messages' words), or ``""`` when none failed."""
    kinds = Counter(v.kind.value if v.kind is not None else "other" for v in verdicts if not v.passed)
    return ", ".join(f"{kind} {count}" for kind, count in kinds.most_common(top))


def class_summary(results: Sequence[NotebookResult], figure: Path | None = None, roster: Roster | None = None) -> str:
    """Markdown: per exercise the number of notebooks, the pass rate (full marks), the median score, and per
    part its pass rate, median marks, its most common failure kinds and its three most common failure reasons;
    with ``roster``, the learners who sent no notebook. With ``figure``, also draws a histogram of the scores there
    (PNG)."""
    by_exercise: dict[str, list[NotebookResult]] = {}
    for r in results:
        by_exercise.setdefault(r.exercise or "unknown", []).append(r)
    lines = ["# Class summary", ""]
    if roster is not None:
        missing = roster.missing([r.path for r in results])
        everyone = roster.missing([])
        lines += [f"## Missing: {len(missing)} of the roster's {len(everyone)} learners sent no notebook", ""]
        lines += [f"- {learner_id}" + (f" ({name})" if name else "") for learner_id, name in missing] or ["None."]
        lines.append("")
    for exercise, group in sorted(by_exercise.items()):
        max_score = max(r.max_score for r in group)
        full = sum(r.max_score > 0 and r.score == r.max_score for r in group)
        lines += [f"## {exercise}", "",
                  f"{len(group)} notebook(s); {full} with full marks ({100 * full / len(group):.0f}%); median score "
                  f"{_num(statistics.median(r.score for r in group))} of {max_score}; median time "
                  f"{statistics.median(r.seconds for r in group):.1f} s.", "",
                  "| part | pass rate | median marks | max | why parts failed |", "|---|---|---|---|---|"]
        names = list(dict.fromkeys(v.part for r in group for v in r.parts))
        for name in names:
            verdicts = [v for r in group for v in r.parts if v.part == name]
            rate = sum(v.passed for v in verdicts) / len(verdicts)
            lines.append(f"| {name} | {100 * rate:.0f}% | {_num(statistics.median(v.score for v in verdicts))} | "
                         f"{verdicts[0].max_score} | {failure_kinds(verdicts)} |")
        lines += ["", "Most common reasons a part lost marks (notebooks, an example of the message):", ""]
        for name in names:
            verdicts = [v for r in group for v in r.parts if v.part == name]
            reasons = common_failures(verdicts)
            if not reasons:
                lines.append(f"- {name}: no failures.")
                continue
            lines.append(f"- {name}:")
            lines += [f"  {rank}. ({count}) {reason}" for rank, (count, reason) in enumerate(reasons, start=1)]
        lines.append("")
    if figure is not None and results:
        _histogram(by_exercise, figure)
        lines += [f"![Histogram of the scores, one panel per exercise]({figure.name})", ""]
    return "\n".join(lines)


def _histogram(by_exercise: dict[str, list[NotebookResult]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    count = len(by_exercise)
    columns = min(3, count)
    rows = (count + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(2.5 * columns, 2.2 * rows), squeeze=False)
    for ax, (exercise, group) in zip(axes.flat, sorted(by_exercise.items())):
        max_score = max(r.max_score for r in group)
        ax.hist([r.score for r in group], bins=max(1, min(max_score, 20)), range=(0, max(max_score, 1)),
                color="#4c72b0")
        ax.set_title(exercise, fontsize=9)
        ax.set_xlabel("score", fontsize=8)
        ax.set_ylabel("notebooks", fontsize=8)
    for ax in list(axes.flat)[count:]:
        ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --- one feedback file per learner ------------------------------------------------------------------------
def feedback_markdown(result: NotebookResult, learner: tuple[str, str] = ("", ""), hint_levels: int = 1) -> str:
    """What a learner can be sent: their marks per part, each failed case's message, and for every part not
    passed its hints up to ``hint_levels`` (default 1, the concept; 2 adds the approach: an instructor's
    choice). A part lost to an edited check cell gets no hint: its code was not judged, the cell is what to fix."""
    from attention_course.grading.exercises import exercise_ids, get_exercise

    exercise = get_exercise(result.exercise) if result.exercise in exercise_ids() else None
    who = learner[1] or learner[0] or Path(result.path).name
    lines = [f"# Feedback on {result.exercise or 'your notebook'}: {who}", "",
             f"**Score: {_num(result.score)} of {result.max_score} points.**", ""]
    if result.message:
        lines += [f"Note: {result.message}", ""]
    lines += ["| part | marks | result |", "|---|---|---|"]
    for v in result.parts:
        passed = sum(c.passed for c in v.cases)
        state = "passed" if v.passed else (f"{passed} of {len(v.cases)} cases passed" if v.cases else v.status)
        lines.append(f"| {v.part} | {_num(v.score)} / {v.max_score} | {state} |")
    for v in result.parts:
        if v.passed:
            continue
        lines += ["", f"## {v.part}", ""]
        if v.cause:
            lines += [f"First: {v.cause}.", ""]
        failed = [c for c in v.cases if not c.passed]
        if failed:
            lines += [f"- **{c.name}**: {c.message}" for c in failed]
        else:
            lines.append(f"- {v.message}")
        part = next((p for p in exercise.parts if p.name == v.part), None) if exercise else None
        if part is not None and not v.message.startswith(CHECK_CELL_EDITED):
            for level, text in enumerate(part.hints[:max(hint_levels, 0)], start=1):
                label = "Hint (concept)" if level == 1 else f"Hint {level} (approach)"
                lines += ["", f"{label}: {text}"]
    return "\n".join(lines) + "\n"


def feedback_html(result: NotebookResult, learner: tuple[str, str] = ("", ""), hint_levels: int = 1) -> str:
    """:func:`feedback_markdown` as a small standalone HTML page (text escaped)."""
    body: list[str] = []
    in_table = False
    for line in feedback_markdown(result, learner, hint_levels).splitlines():
        text = html.escape(line).replace("**", "")
        is_row = line.startswith("|")
        if is_row and not in_table:
            body.append("<table>")
        elif in_table and not is_row:
            body.append("</table>")
        in_table = is_row
        if line.startswith("|---"):
            continue
        if is_row:
            body.append("<tr>" + "".join(f"<td>{cell.strip()}</td>" for cell in text.strip("|").split("|")) + "</tr>")
        elif line.startswith("## "):
            body.append(f"<h2>{text[3:]}</h2>")
        elif line.startswith("# "):
            body.append(f"<h1>{text[2:]}</h1>")
        elif line.startswith("- "):
            body.append(f"<p>&bull; {text[2:]}</p>")
        elif line.strip():
            body.append(f"<p>{text}</p>")
    if in_table:
        body.append("</table>")
    return ("<!doctype html>\n<html><head><meta charset='utf-8'><title>Feedback</title></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def feedback_files(results: Sequence[NotebookResult], folder: Path, roster: Roster | None = None,
                   fmt: str = "md", hint_levels: int = 1) -> list[Path]:
    """Write one feedback file per notebook into ``folder`` (named after the learner id, else the notebook),
    with hints up to ``hint_levels`` (see :func:`feedback_markdown`)."""
    written: list[Path] = []
    for index, r in enumerate(results):
        learner = roster.lookup(r.path) if roster else ("", "")
        stem = learner[0] or Path(r.path).stem
        stem = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in stem) or f"notebook{index}"
        path = folder / f"{stem}.{fmt}"
        if path in written:
            path = folder / f"{stem}-{index}.{fmt}"
        write(path, feedback_html(r, learner, hint_levels) if fmt == "html"
              else feedback_markdown(r, learner, hint_levels))
        written.append(path)
    return written
