"""Generate the learner notebooks from the solution notebooks (the one source).

``python -m attention_course.grading.generate`` (run from the repository root) reads every
``exercises/solutions/*.ipynb`` and writes ``exercises/<same name>.ipynb``:

- code between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` becomes a ``raise NotImplementedError``
  stub, or the block's ``### BUGGY`` starting code
  (see :func:`~attention_course.grading.notebook_format.learner_source`);
- cells tagged ``solution-only`` are dropped, ``hide-input`` tags are removed;
- outputs and execution counts are stripped and cell ids renumbered, as ``nbstripout`` would, except the
  graded and check cells: their ids are ``graded-<part>`` and ``check-<part>``
  (:func:`~attention_course.grading.notebook_format.graded_cell_id`), the same in every handout, so that
  the notebook check can tell, from the id a front end sends with each execution, which cell the grader
  will read (verify the learner notebooks with ``nbstripout --verify --keep-id``).

The output depends only on the input, so generating twice changes nothing. ``--check`` writes nothing and
exits with status 1 when a learner notebook is missing or differs from what would be generated (CI).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import nbformat

from attention_course.grading.notebook_format import (
    TAG_CHECK,
    TAG_GRADED,
    TAG_HIDE_INPUT,
    TAG_SOLUTION_ONLY,
    cell_part,
    cell_tags,
    check_cell_id,
    graded_cell_id,
    learner_markdown,
    learner_source,
    normalize,
    notebook_exercise,
    strip_tags,
)

__all__ = ["handout_ids", "learner_notebook", "render", "generate", "main"]


def learner_notebook(solution: nbformat.NotebookNode, name: str = "notebook") -> nbformat.NotebookNode:
    """The learner version of ``solution`` (which is not modified). ``name`` appears in error messages.

    Raises:
        ValueError: the notebook has no ``grading.exercise`` metadata, or a cell's markers are malformed.
    """
    if notebook_exercise(solution) is None:
        raise ValueError(f"{name}: notebook metadata lacks {{'grading': {{'exercise': ...}}}}")
    nb = copy.deepcopy(solution)
    cells = []
    for index, cell in enumerate(nb.cells):
        if TAG_SOLUTION_ONLY in cell_tags(cell):
            continue
        if cell.cell_type == "code":
            cell.source = learner_source(cell.source, where=f"{name}, cell {index}")
        elif cell.cell_type == "markdown":
            cell.source = learner_markdown(cell.source)
        strip_tags(cell, [TAG_HIDE_INPUT])
        cells.append(cell)
    nb.cells = cells
    return handout_ids(normalize(nb), name)


def handout_ids(nb: nbformat.NotebookNode, name: str = "notebook") -> nbformat.NotebookNode:
    """Give each graded and check cell its known id (``graded-<part>``, ``check-<part>``), in place.

    Raises:
        ValueError: two graded (or two check) cells for one part: their ids would clash.
    """
    seen: set[str] = set()
    for index, cell in enumerate(nb.cells):
        part, tags = cell_part(cell), cell_tags(cell)
        if cell.cell_type != "code" or part is None:
            continue
        for tag, make_id in ((TAG_GRADED, graded_cell_id), (TAG_CHECK, check_cell_id)):
            if tag in tags:
                cell_id = make_id(part)
                if cell_id in seen:
                    raise ValueError(f"{name}, cell {index}: a second {tag!r} cell for part {part!r}")
                seen.add(cell_id)
                cell["id"] = cell_id
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    """The notebook as committed: nbformat's JSON layout with a final newline."""
    return nbformat.writes(nb) + "\n"


def generate(source_dir: Path, out_dir: Path, check: bool = False) -> list[Path]:
    """Write (or, with ``check``, compare) the learner notebook for each ``*.ipynb`` in ``source_dir``.

    Returns:
        The learner notebooks that were out of date (written, or only reported with ``check``).
    """
    sources = sorted(source_dir.glob("*.ipynb"))
    if not sources:
        raise FileNotFoundError(f"no solution notebooks (*.ipynb) in {source_dir}")
    stale = []
    for source in sources:
        solution = nbformat.read(source, as_version=4)
        text = render(learner_notebook(solution, name=str(source)))
        target = out_dir / source.name
        if target.exists() and target.read_text(encoding="utf-8") == text:
            continue
        stale.append(target)
        if not check:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attention_course.grading.generate",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--solutions", type=Path, default=Path("exercises/solutions"),
                        help="folder of solution notebooks (default: exercises/solutions)")
    parser.add_argument("--out", type=Path, default=Path("exercises"),
                        help="folder for the learner notebooks (default: exercises)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if any learner notebook is missing or out of date")
    args = parser.parse_args(argv)
    try:
        stale = generate(args.solutions, args.out, check=args.check)
    except (OSError, ValueError, nbformat.ValidationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    verb = "out of date" if args.check else "written"
    for path in stale:
        print(f"{verb}: {path}")
    if not stale:
        print(f"learner notebooks in {args.out} are up to date")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    raise SystemExit(main())
