"""Grade exercise notebooks without trusting anything the learner wrote or printed.

For each notebook the grader:

1. reads it once, before any learner code runs (a regular file only: no symlink, FIFO or device; at most
   20 MB), records the bytes' sha256, and grades from that snapshot (a file that is not a notebook, or a
   malformed one, gets a clear message that quotes nothing from it, and 0 points);
2. works out the exercise (notebook metadata, else the file name, else ``exercise_id``);
3. takes the learner's graded cells by tag and part name, one per part (the last that defines the part's
   function, as a run from top to bottom leaves it; outputs are ignored; a part whose check cell was edited
   or deleted earns nothing), and carries in the plain functions and imports they use from other cells
   (an analysis linear in the notebook's size, stopped after ``CARRY_DEADLINE`` seconds);
4. generates fresh inputs for every part, in this process;
5. runs the preamble and graded cells and calls the learner's functions in a fresh, isolated process
   (:mod:`attention_course.grading.sandbox`: bubblewrap, no network, no submissions, solutions or grades
   in sight, limits it cannot raise), which sends back only wire-form outputs; a part whose cell uses a
   course-library name it may not use earns nothing (:mod:`attention_course.grading.library_rules`);
6. judges the outputs here, against references and properties it computes from its own inputs.

A part earns its points in proportion to the cases passed (``all_or_nothing``: only if every case passes).
Steps 4-6 are shared with the notebook check: see :mod:`attention_course.grading.evaluate`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import torch

from attention_course.grading.evaluate import (
    CARRY_DEADLINE,
    AnalysisTimeout,
    assemble,
    carried_definitions,
    carried_note,
    check_cell_ok,
    exercise_mismatch,
    with_carried,
)
from attention_course.grading.exercises import exercise_ids, get_exercise
from attention_course.grading.findings import FailureKind
from attention_course.grading.isolation import Limits, SandboxUnavailable, check_sandbox, clean_text, read_submission
from attention_course.grading.judge import PartVerdict, failed_part
from attention_course.grading.launcher import close_pools
from attention_course.grading.library_rules import broken_parts, exercise_allowed
from attention_course.grading.notebook_format import (
    TAG_GRADED,
    cell_part,
    cell_tags,
    defined_names,
    notebook_exercise,
)
from attention_course.grading.sandbox import DEFAULT_OUTPUT_LIMIT, run_parts
from attention_course.grading.spec import Exercise

__all__ = ["NotebookResult", "SandboxUnavailable", "UNISOLATED", "find_notebooks", "grade_notebook", "grade_paths"]

MAX_NOTEBOOK_BYTES = 20_000_000
#: Starts the message of every notebook graded with ``--no-sandbox``.
UNISOLATED = "UNISOLATED (--no-sandbox): the learner's code ran with the grader's own rights"


def _kind(kind: FailureKind | None) -> str | None:
    """A failure kind as the JSON report writes it (its value, e.g. ``"shape"``), ``None`` for a pass."""
    return None if kind is None else kind.value


@dataclass
class NotebookResult:
    """The grade of one notebook: its score and one verdict per part."""

    path: str
    exercise: str | None
    score: int
    max_score: int
    parts: list[PartVerdict] = field(default_factory=list)
    message: str = ""
    seed: int | None = None
    seconds: float = 0.0
    sha256: str | None = None
    isolated: bool = True
    worker_cpu_seconds: float = 0.0  # reported by the workers, for benchmarks (not in the report)

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "exercise": self.exercise,
            "score": self.score,
            "max_score": self.max_score,
            "message": self.message,
            "seed": self.seed,
            "seconds": round(self.seconds, 2),
            "sha256": self.sha256,
            "isolated": self.isolated,
            "parts": [
                {"name": v.part, "score": v.score, "max_score": v.max_score, "status": v.status, "message": v.message,
                 "kind": _kind(v.kind),
                 "cases": [{"name": c.name, "passed": c.passed, "message": c.message, "kind": _kind(c.kind)}
                           for c in v.cases]}
                for v in self.parts
            ],
        }


def find_notebooks(paths: Iterable[str | Path]) -> list[Path]:
    """The files to grade: each file as given, and every ``*.ipynb`` under each folder (recursively,
    skipping ``.ipynb_checkpoints`` and hidden folders), in sorted order, without duplicates."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            for candidate in sorted(path.rglob("*.ipynb")):
                relative = candidate.relative_to(path).parts
                if any(part == ".ipynb_checkpoints" or part.startswith(".") for part in relative[:-1]):
                    continue
                found.append(candidate)
        else:
            found.append(path)
    unique: dict[str, Path] = {}
    for path in found:
        unique.setdefault(os.path.normpath(str(path)), path)
    return list(unique.values())


def guess_exercise(path: Path) -> str | None:
    """The exercise id from a file name such as ``ex02_hard_and_soft_attention (1).ipynb``."""
    for exercise_id in sorted(exercise_ids(), key=len, reverse=True):
        if re.search(rf"(?<![0-9a-z]){re.escape(exercise_id)}(?![0-9])", path.name.lower()):
            return exercise_id
    return None


def _graded_cells(nb: nbformat.NotebookNode, exercise: Exercise) -> tuple[list[tuple[int, str, str]], str]:
    """``(index, part, source)`` of the graded cells; falls back to finding the parts' functions when an
    editor dropped every cell's metadata. Returns a note for the report when the fallback was used."""
    names = {part.name for part in exercise.parts}
    cells = [
        (index, cell_part(cell), cell.source)
        for index, cell in enumerate(nb.cells)
        if cell.get("cell_type") == "code" and TAG_GRADED in cell_tags(cell) and cell_part(cell) in names
        and isinstance(cell.get("source"), str)
    ]
    if cells or any(cell_part(cell) for cell in nb.cells):
        return cells, ""
    by_function = {part.function: part.name for part in exercise.parts}
    for index, cell in enumerate(nb.cells):
        if cell.get("cell_type") == "code" and isinstance(cell.get("source"), str):
            for function in defined_names(cell.source) & by_function.keys():
                cells.append((index, by_function[function], cell.source))
    note = "no cell carries grading metadata (was it removed by an editor?); cells were matched by function name"
    return cells, note if cells else ""


def _one_cell_per_part(cells: list[tuple[int, str, str]], exercise: Exercise) \
        -> tuple[list[tuple[int, str, str]], str]:
    """One graded cell per part, as a kernel run top to bottom leaves it: the last of the part's cells that
    defines its function (else its last cell). A notebook that copied a graded cell many times (each copy
    one more process to start, were they all sent) is graded like the one it would run. Returns the note
    for the report when a part had more than one."""
    functions = {part.name: part.function for part in exercise.parts}
    by_part: dict[str, list[tuple[int, str, str]]] = {}
    for cell in cells:
        by_part.setdefault(cell[1], []).append(cell)
    chosen: list[tuple[int, str, str]] = []
    doubled: list[str] = []
    for part, found in by_part.items():
        if len(found) > 1:
            doubled.append(part)
            found = [cell for cell in found if functions.get(part) in defined_names(cell[2])] or found
        chosen.append(found[-1])
    chosen.sort(key=lambda cell: cell[0])
    note = (f"more than one graded cell for {', '.join(doubled)}: only the last one that defines the part's "
            "function was graded (as a run of the notebook from top to bottom leaves it)") if doubled else ""
    return chosen, note


#: Characters of a check cell the grader reads (a handed-out check cell is one line; a debug print or two is
#: fine): a longer cell is not the check cell, and is not parsed.
CHECK_CELL_LIMIT = 20_000


def _check_cell_intact(nb: nbformat.NotebookNode, part: str, function: str, functions: Sequence[str] = ()) -> bool:
    """Whether the notebook still has the part's check cell (see :func:`evaluate.check_cell_ok`). Found by
    content, so an editor that dropped the cell tags does not matter."""
    return any(cell.get("cell_type") == "code" and isinstance(cell.get("source"), str)
               and f".{part}" in cell.source and len(cell.source) <= CHECK_CELL_LIMIT  # parsed: small cells only
               and check_cell_ok(cell.get("source"), part, function, functions) for cell in nb.cells)


def _carry(nb: nbformat.NotebookNode, exercise: Exercise, cells: list[tuple[int, str, str]]) \
        -> tuple[list[tuple[int, str, str]], str]:
    """The graded cells with the plain functions and imports they use from the notebook's other cells put at
    their top (:func:`evaluate.carried_definitions`), and the note that tells the learner so."""
    graded: dict[str, str] = {}
    for _, part, source in cells:
        graded[part] = graded.get(part, "") + source + "\n"
    indices = {index for index, _, _ in cells}
    others = [cell.source for index, cell in enumerate(nb.cells)
              if index not in indices and cell.get("cell_type") == "code" and isinstance(cell.get("source"), str)]
    try:
        carried = carried_definitions(graded, others, exercise.preamble, [part.function for part in exercise.parts],
                                      deadline=time.monotonic() + CARRY_DEADLINE)
    except AnalysisTimeout:
        return cells, (f"nothing was carried from your other cells: reading them for the helpers your graded "
                       f"cells use took more than {CARRY_DEADLINE:g} s; keep what your graded code needs in its "
                       "graded cell")
    return [(index, part, with_carried(source, carried.get(part))) for index, part, source in cells], \
        carried_note(carried)


def _fail(path: Path, message: str, exercise: Exercise | None = None, seed: int | None = None) -> NotebookResult:
    parts = [failed_part(part, message) for part in exercise.parts] if exercise else []
    return NotebookResult(str(path), exercise.id if exercise else None, 0,
                          exercise.max_score if exercise else 0, parts, message, seed)


def grade_notebook(
    path: str | Path,
    timeout: float = 30.0,
    seed: int | None = None,
    exercise_id: str | None = None,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
    all_or_nothing: bool = False,
    isolation: str = "required",
    limits: Limits | None = None,
    warm: int = 0,
    budget: float | None = None,
) -> NotebookResult:
    """Grade one notebook; never raises for anything about the file or the code in it.

    Args:
        path: the notebook.
        timeout: seconds allowed for each graded cell and for each part's checks.
        seed: seed for the generated inputs (default: fresh); the result records it for reproduction.
        exercise_id: grade as this exercise whatever the notebook says.
        output_limit: bytes the learner's code may print per process.
        all_or_nothing: a part earns its points only if every case passes (default: in proportion).
        isolation: ``"required"`` (bubblewrap, else :class:`SandboxUnavailable`), ``"auto"`` or ``"none"``
            (``--no-sandbox``: every message then starts with :data:`UNISOLATED`).
        limits: resource limits of the learner's processes (default
            :class:`~attention_course.grading.isolation.Limits`).
        warm: sandboxes to keep started ahead of need (see :func:`grade_paths`).
        budget: seconds the notebook's code may take in all (default
            :func:`~attention_course.grading.sandbox.notebook_budget`: fixed, not per cell).
    """
    started = time.monotonic()
    result = _grade_notebook(path, timeout, seed, exercise_id, output_limit, all_or_nothing,
                             isolation, limits, warm, budget)
    result.seconds = time.monotonic() - started
    return _clean(result)


def _clean(result: NotebookResult) -> NotebookResult:
    """Every text of the result on one line, without control characters or ANSI escapes (learners'
    exception messages and file names must not forge lines of the report or move the cursor)."""
    def part(verdict: PartVerdict) -> PartVerdict:
        cases = tuple(dataclasses.replace(case, name=clean_text(case.name, 300),
                                          message=None if case.message is None else clean_text(case.message, 1000))
                      for case in verdict.cases)
        fields = {"message": clean_text(verdict.message, 2000), "cases": cases}
        if isinstance(getattr(verdict, "cause", None), str):
            fields["cause"] = clean_text(verdict.cause, 500)
        return dataclasses.replace(verdict, **fields)

    result.path = clean_text(result.path, 1000)
    result.message = clean_text(result.message, 2000)
    result.parts = [part(verdict) for verdict in result.parts]
    if not result.isolated and not result.message.startswith(UNISOLATED):
        result.message = UNISOLATED + (f"; {result.message}" if result.message else "")
    return result


def _read_notebook(path: Path) -> tuple[nbformat.NotebookNode, str] | str:
    """The notebook from one safe read of ``path`` and its sha256, or why it was refused. The message
    quotes nothing from the file (it may be /etc/passwd behind a name ending in .ipynb)."""
    snapshot = read_submission(path, MAX_NOTEBOOK_BYTES)
    if isinstance(snapshot, str):
        return snapshot
    try:
        text = snapshot.data.decode("utf-8")
    except UnicodeDecodeError:
        return "could not read the notebook (it is not UTF-8 text)"
    try:
        json.loads(text)
    except RecursionError:
        return "could not read the notebook (its JSON is nested too deeply)"
    except ValueError as exc:
        where = f": line {exc.lineno}, column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        return f"could not read the notebook (it is not valid JSON{where})"
    try:
        nb = nbformat.reads(text, as_version=4)
        if not (isinstance(nb.get("cells"), list) and all(isinstance(c, dict) for c in nb.cells)):
            raise ValueError("no list of cells")
    except Exception as exc:
        return f"could not read the notebook (it is JSON but not a Jupyter notebook: {type(exc).__name__})"
    return nb, snapshot.sha256


def _grade_notebook(path: str | Path, timeout: float, seed: int | None, exercise_id: str | None,
                    output_limit: int, all_or_nothing: bool, isolation: str = "required",
                    limits: Limits | None = None, warm: int = 0, budget: float | None = None) -> NotebookResult:
    path = Path(path)
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
    isolated = isolation != "none"
    if path.suffix.lower() != ".ipynb":
        return _fail(path, f"not a notebook: expected a .ipynb file, got {path.name!r}")
    read = _read_notebook(path)
    if isinstance(read, str):
        return dataclasses.replace(_fail(path, read), isolated=isolated)
    nb, sha256 = read

    chosen = exercise_id or notebook_exercise(nb) or guess_exercise(path)
    if chosen not in exercise_ids():
        return dataclasses.replace(
            _fail(path, f"cannot tell which exercise this is (found {clean_text(chosen, 40)!r}; known: "
                        f"{exercise_ids()}); pass --exercise"), sha256=sha256, isolated=isolated)
    mismatch = exercise_mismatch(chosen, notebook_exercise(nb), forced=exercise_id is not None,
                                 guessed=guess_exercise(path) or guess_exercise(path.parent))
    if mismatch and exercise_id is not None:
        return dataclasses.replace(_fail(path, mismatch, get_exercise(chosen), seed), sha256=sha256, isolated=isolated)
    exercise = get_exercise(chosen)
    cells, note = _graded_cells(nb, exercise)
    cells, doubled = _one_cell_per_part(cells, exercise)
    cells, carried = _carry(nb, exercise, cells)
    note = "; ".join(filter(None, [mismatch, note, doubled, carried]))
    present = {part for _, part, _ in cells}

    generator = torch.Generator().manual_seed(seed)
    cases = {part.name: part.make_cases(generator) for part in exercise.parts}
    to_run = [(part.name, cases[part.name]) for part in exercise.parts if part.name in present]
    sandbox = run_parts(exercise.id, exercise.preamble, cells, to_run, timeout=timeout, output_limit=output_limit,
                        isolation=isolation, limits=limits, allowed=exercise_allowed(exercise.id), warm=warm,
                        budget=budget)

    sources = {part: source for _, part, source in cells}
    functions = [part.function for part in exercise.parts]
    check_cells = {part.name: _check_cell_intact(nb, part.name, part.function, functions) for part in exercise.parts}
    verdicts = assemble(exercise, sources, cases, sandbox, check_cells, all_or_nothing)
    # The library rule (library_rules): a part whose cell uses a course-library name it may not earns nothing.
    broken = broken_parts(exercise.id, exercise.preamble, cells)
    parts_by_name = {part.name: part for part in exercise.parts}
    verdicts = [failed_part(parts_by_name[v.part], broken[v.part], kind=FailureKind.FORBIDDEN) if v.part in broken
                else v for v in verdicts]
    score = round(sum(verdict.score for verdict in verdicts), 2)
    return NotebookResult(str(path), exercise.id, score, exercise.max_score, verdicts, note, seed, sha256=sha256,
                          isolated=sandbox.isolated, worker_cpu_seconds=sandbox.worker_cpu_seconds)


def grade_paths(
    paths: Sequence[str | Path],
    timeout: float = 30.0,
    jobs: int = 1,
    seed: int | None = None,
    exercise_id: str | None = None,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
    all_or_nothing: bool = False,
    isolation: str = "required",
    limits: Limits | None = None,
    budget: float | None = None,
) -> list[NotebookResult]:
    """Grade every notebook under ``paths`` (see :func:`find_notebooks`), ``jobs`` at a time, in order.

    Every exercise module is imported (and so frozen) before the first learner's code runs, and every
    sandbox the run started is killed before it returns.

    Raises:
        SandboxUnavailable: ``isolation="required"`` and bubblewrap is missing or does not work here (the
            message says how to install it, and names ``--no-sandbox``).
    """
    notebooks = find_notebooks(paths)
    if isolation == "required":
        check_sandbox()
    for known in exercise_ids():  # imported now, before any learner code runs
        try:
            get_exercise(known)
        except Exception:  # a broken module fails its own notebooks only
            pass

    def grade(path: Path) -> NotebookResult:
        if not os.path.lexists(path):
            return _clean(dataclasses.replace(_fail(path, "no such file or folder"), isolated=isolation != "none"))
        try:
            return grade_notebook(path, timeout=timeout, seed=seed, exercise_id=exercise_id,
                                  output_limit=output_limit, all_or_nothing=all_or_nothing, isolation=isolation,
                                  limits=limits, warm=max(1, jobs), budget=budget)
        except Exception as exc:  # a bug in an exercise's checks must not stop a whole class's grading
            return _clean(dataclasses.replace(
                _fail(path, f"internal grader error ({type(exc).__name__}: {exc}); please report it"),
                isolated=isolation != "none"))

    try:
        if jobs <= 1 or len(notebooks) <= 1:
            return [grade(path) for path in notebooks]
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(grade, notebooks))
    finally:
        close_pools()  # no sandbox outlives the run
