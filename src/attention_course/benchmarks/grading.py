"""How fast the grader is: seconds per notebook over a folder of 30 submissions.

The folder mixes, in turn for every exercise, a copy of the solution notebook (full marks), the learner
notebook as handed out (zero), and a wrong submission (the learner notebook with every stub returning
``None``). The figure includes starting the grader's worker processes; notebooks are graded one at a time
(``jobs=1``), so it is the cost of one core.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from pathlib import Path

import nbformat

from attention_course.grading.grader import grade_paths

NOTEBOOKS = 30
ROOT = Path(__file__).resolve().parents[3]


def _submissions(folder: Path) -> None:
    solutions = sorted((ROOT / "exercises" / "solutions").glob("*.ipynb"))
    if not solutions:
        raise FileNotFoundError(f"no solution notebooks in {ROOT / 'exercises' / 'solutions'}: run from a clone")
    kinds = itertools.cycle(["solution", "learner", "wrong"])
    for index, (path, kind) in enumerate(zip(itertools.cycle(solutions), kinds)):
        if index == NOTEBOOKS:
            break
        source = path if kind == "solution" else ROOT / "exercises" / path.name
        nb = nbformat.read(source, as_version=4)
        if kind == "wrong":
            for cell in nb.cells:
                if cell.cell_type == "code":
                    cell.source = cell.source.replace('raise NotImplementedError("replace this line with your code")',
                                                      "return None")
        nbformat.write(nb, folder / f"{index:02d}_{kind}_{path.name}")


def run() -> dict:
    with tempfile.TemporaryDirectory(prefix="grading-benchmark-") as tmp:
        folder = Path(tmp)
        _submissions(folder)
        start = time.perf_counter()
        results = grade_paths([folder], timeout=60.0, jobs=1, seed=0)
        seconds = time.perf_counter() - start
    solutions = [r for r in results if "_solution_" in Path(r.path).name]
    return {
        "seconds_per_notebook": seconds / len(results),
        "notebooks": len(results),
        "total_seconds": seconds,
        "solutions_with_full_marks": sum(r.score == r.max_score for r in solutions),
        "solutions": len(solutions),
    }
