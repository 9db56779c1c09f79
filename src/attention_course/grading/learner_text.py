"""Reading a learner's cell as Python, in bounded time: the one place the grader parses learner text.

A graded cell may hold IPython syntax (``%%time``, ``%timeit``, ``!pip install``). IPython's own
transformer re-tokenises the whole cell once per magic line (up to 500 times), so a cell of a few thousand
``!echo`` lines takes minutes of the grader's time, outside any sandbox. :func:`to_python` replaces it with
a single pass over the lines, linear in the cell's size, and refuses a cell over :data:`CELL_LIMIT`
characters; :func:`parse` caches its trees, so the several analyses of one cell (the library rule, the
names a cell defines and reads) parse it once.

The meaning matches what the worker runs: the body of a Python cell magic (``%%time``, ``%%timeit``,
``%%capture``, ``%%prun``) is the cell's code; any other cell magic (``%%bash``, ``%%writefile``) runs
nothing; line magics and shell commands are skipped (``x = !ls`` binds ``None``).
"""

from __future__ import annotations

import ast
import functools
import re

__all__ = ["CELL_LIMIT", "LearnerTextError", "parse", "python_cell", "to_python"]

#: Characters of one graded cell the grader reads (a solution cell is a few thousand).
CELL_LIMIT = 200_000
_PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun"})
_ASSIGNED_MAGIC = re.compile(r"^([A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*)\s*=\s*[!%]")


class LearnerTextError(ValueError):
    """A cell the grader does not read (too long); the message says why."""


def _check_size(source: str) -> None:
    if len(source) > CELL_LIMIT:
        raise LearnerTextError(f"this graded cell is {len(source):,} characters, more than the {CELL_LIMIT:,} "
                               "the grader reads; shorten it")


def _compiles(source: str) -> bool:
    try:
        ast.parse(source)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


def to_python(source: str) -> str:
    """``source`` as plain Python (unchanged when it already is); see the module docstring.

    Raises:
        LearnerTextError: the cell is longer than :data:`CELL_LIMIT`.
    """
    _check_size(source)
    if _compiles(source):
        return source
    lines = source.splitlines()
    # Leading cell magics, possibly stacked (%%capture then %%time): their lines become blank lines, so
    # that line numbers in error messages still match the cell.
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        if not line.lstrip().startswith("%%"):
            break
        name = line.strip()[2:].split(maxsplit=1)
        if not name or name[0] not in _PYTHON_CELL_MAGICS:
            return "pass\n"
        lines[index] = ""
    out: list[str] = []
    for line in lines:
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        assigned = _ASSIGNED_MAGIC.match(stripped)
        if stripped.startswith(("!", "%")):
            out.append(indent + "pass")
        elif assigned:
            out.append(f"{indent}{assigned.group(1)} = None")
        elif stripped.endswith("?") and not stripped.startswith("#") and stripped[:-1].replace(".", "").isidentifier():
            out.append(indent + "pass")  # obj? (help)
        else:
            out.append(line)
    return "\n".join(out) + "\n"


@functools.lru_cache(maxsize=512)
def python_cell(source: str) -> str | None:
    """:func:`to_python`, cached; ``None`` for a cell too long to read."""
    try:
        return to_python(source)
    except LearnerTextError:
        return None


@functools.lru_cache(maxsize=512)
def parse(source: str) -> ast.Module | None:
    """The cell's syntax tree (IPython syntax read as :func:`to_python` does), or ``None`` when it is not
    Python or too long. Shared: do not modify the tree."""
    text = python_cell(source)
    if text is None:
        return None
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
