"""The exercise notebook format: cell tags, grading metadata and solution markers.

A notebook is an exercise when its metadata holds ``{"grading": {"exercise": "<id>"}}``. Its cells carry:

- tag ``preamble``: the imports cell; its source equals the exercise module's ``preamble``;
- tag ``graded`` and metadata ``{"grading": {"part": "<part>"}}``: the cell where the learner writes the
  part's function. In the solution notebook the answer sits between ``### BEGIN SOLUTION`` and
  ``### END SOLUTION`` (see :func:`learner_source`);
- tag ``check`` and metadata ``{"grading": {"part": "<part>"}}``: the cell calling ``check.<part>(...)``;
- tag ``solution-only``: dropped from the learner notebook;
- tag ``hide-input``: collapses the code on the website (solution notebooks); dropped for learners.

Graded cells are found by these tags and metadata, never by position. In the learner notebooks the graded
and check cells also carry known cell ids, ``graded-<part>`` and ``check-<part>``
(:func:`graded_cell_id`, :func:`check_cell_id`): front ends that send a cell's id with each execution
(JupyterLab, Notebook 7) let the notebook check find the very cell the grader will read.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from typing import Any

import nbformat

__all__ = [
    "BEGIN_SOLUTION",
    "BUGGY",
    "END_SOLUTION",
    "METADATA_KEY",
    "TAG_CHECK",
    "TAG_GRADED",
    "TAG_HIDE_INPUT",
    "TAG_PREAMBLE",
    "TAG_SOLUTION_ONLY",
    "STUB",
    "cell_part",
    "cell_tags",
    "check_cell_id",
    "graded_cell_id",
    "handout_cell_part",
    "defined_names",
    "learner_source",
    "normalize",
    "notebook_exercise",
]

#: The key of the notebook and cell metadata the grader reads (``{"grading": {"exercise": ...}}``).
METADATA_KEY = "grading"
#: The tag of a cell where the learner writes a part's function; the grader runs only these and the preamble.
TAG_GRADED = "graded"
#: The tag of a cell that calls ``check.<part>(...)``; a part whose check cell was edited or deleted scores 0.
TAG_CHECK = "check"
#: The tag of the exercise's import cell, whose source must equal the exercise module's ``preamble``.
TAG_PREAMBLE = "preamble"
#: The tag of a cell that only the solution notebook has; generation drops it from the learner notebook.
TAG_SOLUTION_ONLY = "solution-only"
#: The tag that collapses a cell's code on the website; generation drops it for learners.
TAG_HIDE_INPUT = "hide-input"

#: The line that opens a solution block in a graded cell.
BEGIN_SOLUTION = "### BEGIN SOLUTION"
#: The line that closes a solution block.
END_SOLUTION = "### END SOLUTION"
#: The line inside a solution block after which the learner's (commented-out) buggy starting code follows.
BUGGY = "### BUGGY"
#: The two lines that replace a solution block without a BUGGY starting code in the learner notebook.
STUB = ("# YOUR CODE HERE", 'raise NotImplementedError("replace this line with your code")')
MARKDOWN_STUB = "*Write your answer here.*"

# Cell metadata that editors add and nbstripout removes: never committed.
_VOLATILE_CELL_METADATA = ("collapsed", "scrolled", "ExecuteTime", "execution", "heading_collapsed", "hidden")


#: How the learner notebooks name the cell ids of a part's graded and check cells.
GRADED_ID_PREFIX = "graded-"
CHECK_ID_PREFIX = "check-"
_CELL_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # nbformat 4.5's rule for cell ids


def graded_cell_id(part: str) -> str:
    """The cell id of part ``part``'s graded cell in a learner notebook, e.g. ``graded-soft_attention_weights``.

    Raises:
        ValueError: ``part`` would not make a valid nbformat cell id (letters, digits, ``-``, ``_``; 64 at most).
    """
    return _valid_id(GRADED_ID_PREFIX + part)


def check_cell_id(part: str) -> str:
    """The cell id of part ``part``'s check cell in a learner notebook, e.g. ``check-soft_attention_weights``."""
    return _valid_id(CHECK_ID_PREFIX + part)


def _valid_id(cell_id: str) -> str:
    if not _CELL_ID.match(cell_id):
        raise ValueError(f"{cell_id!r} is not a valid notebook cell id (letters, digits, '-' and '_', 64 at most)")
    return cell_id


def handout_cell_part(cell_id: Any) -> tuple[str, str] | None:
    """``("graded" | "check", part)`` for a cell id that :func:`graded_cell_id` or :func:`check_cell_id` gave,
    else ``None``."""
    if not isinstance(cell_id, str):
        return None
    for kind, prefix in (("graded", GRADED_ID_PREFIX), ("check", CHECK_ID_PREFIX)):
        if cell_id.startswith(prefix) and len(cell_id) > len(prefix):
            return kind, cell_id[len(prefix):]
    return None


def cell_tags(cell: Any) -> list[str]:
    """The cell's tags (``[]`` when it has none or its metadata is malformed)."""
    metadata = cell.get("metadata") if isinstance(cell, dict) else None
    tags = metadata.get("tags") if isinstance(metadata, dict) else None
    return [tag for tag in tags if isinstance(tag, str)] if isinstance(tags, list) else []


def cell_part(cell: Any) -> str | None:
    """The part name in the cell's grading metadata, if any."""
    metadata = cell.get("metadata") if isinstance(cell, dict) else None
    grading = metadata.get(METADATA_KEY) if isinstance(metadata, dict) else None
    part = grading.get("part") if isinstance(grading, dict) else None
    return part if isinstance(part, str) else None


def notebook_exercise(nb: Any) -> str | None:
    """The exercise id in the notebook's metadata, if any."""
    metadata = nb.get("metadata") if isinstance(nb, dict) else None
    grading = metadata.get(METADATA_KEY) if isinstance(metadata, dict) else None
    exercise = grading.get("exercise") if isinstance(grading, dict) else None
    return exercise if isinstance(exercise, str) else None


def defined_names(source: str) -> set[str]:
    """Names of the functions and classes a cell defines at top level (empty if it does not parse)."""
    from attention_course.grading.learner_text import parse

    tree = parse(source) if isinstance(source, str) else None
    if tree is None:
        return set()
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _uncomment(line: str, indent: str, where: str) -> str:
    """Turn a commented buggy line (``<indent># code``) back into code (``<indent>code``)."""
    if not line.strip():
        return ""
    if not line.startswith(indent + "#"):
        raise ValueError(f"{where}: lines after {BUGGY} must be commented out at the block's indentation "
                         f"({indent!r} + '# '), got {line!r}")
    rest = line[len(indent) + 1:]
    return indent + (rest[1:] if rest.startswith(" ") else rest)


def learner_source(source: str, where: str = "cell") -> str:
    """The learner's version of a solution cell's source.

    Each block between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` is replaced, at the indentation of
    the ``BEGIN`` line, by :data:`STUB` (a ``raise NotImplementedError``). If the block contains a line
    ``### BUGGY``, the lines after it (written commented out, so the solution notebook runs the fixed
    code above them) become the learner's starting code instead: that is how a bug hunt hands out broken
    code. Everything outside the markers (signatures, docstrings, hint comments) is kept.

    Raises:
        ValueError: unbalanced markers, or a buggy line that is not commented out (``where`` names the cell).
    """
    out: list[str] = []
    state, indent, buggy = "code", "", []
    for number, line in enumerate(source.split("\n"), start=1):
        marker = line.strip()
        if state == "code":
            if marker == BEGIN_SOLUTION:
                state, indent, buggy = "solution", _indent_of(line), []
            elif marker in (END_SOLUTION, BUGGY):
                raise ValueError(f"{where}, line {number}: {marker} without {BEGIN_SOLUTION}")
            else:
                out.append(line)
        elif marker == BEGIN_SOLUTION:
            raise ValueError(f"{where}, line {number}: nested {BEGIN_SOLUTION}")
        elif marker == BUGGY:
            if state == "buggy":
                raise ValueError(f"{where}, line {number}: two {BUGGY} lines in one block")
            state = "buggy"
        elif marker == END_SOLUTION:
            out.extend(buggy if state == "buggy" else [indent + stub for stub in STUB])
            state = "code"
        elif state == "buggy":
            buggy.append(_uncomment(line, indent, f"{where}, line {number}"))
    if state != "code":
        raise ValueError(f"{where}: {BEGIN_SOLUTION} without {END_SOLUTION}")
    return "\n".join(out)


def learner_markdown(source: str) -> str:
    """Markdown answers between the markers are replaced by an invitation to answer."""
    if BEGIN_SOLUTION not in source:
        return source
    out, inside = [], False
    for line in source.split("\n"):
        if line.strip() == BEGIN_SOLUTION:
            inside = True
            out.append(MARKDOWN_STUB)
        elif line.strip() == END_SOLUTION:
            inside = False
        elif not inside:
            out.append(line)
    return "\n".join(out)


def _without(tags: Iterable[str], drop: Iterable[str]) -> list[str]:
    drop = set(drop)
    return [tag for tag in tags if tag not in drop]


def normalize(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Strip outputs, execution counts and volatile metadata, and number cell ids 0, 1, 2, ... in place:
    the form ``nbstripout`` leaves, so committed notebooks pass ``nbstripout --verify``."""
    nb.metadata.pop("widgets", None)
    nb.metadata.pop("signature", None)
    for index, cell in enumerate(nb.cells):
        cell["id"] = str(index)
        for key in _VOLATILE_CELL_METADATA:
            cell.metadata.pop(key, None)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        if "tags" in cell.metadata and not cell.metadata["tags"]:
            del cell.metadata["tags"]
    return nb


def strip_tags(cell: Any, drop: Iterable[str]) -> None:
    """Remove ``drop`` from the cell's tags (and the tags key when none are left)."""
    tags = _without(cell_tags(cell), drop)
    if tags:
        cell.metadata["tags"] = tags
    else:
        cell.metadata.pop("tags", None)
