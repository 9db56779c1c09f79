"""How fast the isolated grader is: seconds per notebook for a class of 100 submissions.

The class mixes, in turn for every exercise, a copy of the solution notebook (full marks), the learner
notebook as handed out (zero), and a wrong submission (the learner notebook with every stub returning
``None``). It is graded twice with operating-system isolation on (a fresh bubblewrap sandbox per notebook,
see :mod:`attention_course.grading.launcher`): notebook by notebook (``jobs=1``) and two at a time
(``jobs=2``). The figures include starting every sandbox (Python and torch imports), the grader's own
references and judging, and reading the notebooks; they also report CPU seconds (the grader's own and
its workers', start-up included), which a busy machine does not inflate as much as wall-clock time.
"""

from __future__ import annotations

import itertools
import os
import resource
import tempfile
import time
from pathlib import Path

import nbformat

from attention_course.grading.grader import grade_paths
from attention_course.grading.isolation import bwrap_path

NOTEBOOKS = 100
ROOT = Path(__file__).resolve().parents[3]


def _submissions(folder: Path, count: int = NOTEBOOKS) -> None:
    solutions = sorted((ROOT / "exercises" / "solutions").glob("*.ipynb"))
    if not solutions:
        raise FileNotFoundError(f"no solution notebooks in {ROOT / 'exercises' / 'solutions'}: run from a clone")
    kinds = itertools.cycle(["solution", "learner", "wrong"])
    for index, (path, kind) in enumerate(zip(itertools.cycle(solutions), kinds)):
        if index == count:
            break
        source = path if kind == "solution" else ROOT / "exercises" / path.name
        nb = nbformat.read(source, as_version=4)
        if kind == "wrong":
            for cell in nb.cells:
                if cell.cell_type == "code":
                    cell.source = cell.source.replace('raise NotImplementedError("replace this line with your code")',
                                                      "return None")
        nbformat.write(nb, folder / f"{index:03d}_{kind}_{path.name}")


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _grade(folder: Path, jobs: int, isolation: str) -> dict:
    cpu, start = _cpu_seconds(), time.perf_counter()
    results = grade_paths([folder], timeout=60.0, jobs=jobs, seed=0, isolation=isolation)
    seconds = time.perf_counter() - start
    # The grader's own CPU plus what each worker reports (its start-up included; bubblewrap's is negligible).
    cpu = _cpu_seconds() - cpu + sum(r.worker_cpu_seconds for r in results)
    solutions = [r for r in results if "_solution_" in Path(r.path).name]
    return {
        "seconds_per_notebook": seconds / len(results),
        "cpu_seconds_per_notebook": cpu / len(results),
        "total_seconds": seconds,
        "solutions_with_full_marks": sum(r.score == r.max_score for r in solutions),
        "solutions": len(solutions),
    }


def run(count: int = NOTEBOOKS) -> dict:
    isolation = "required" if bwrap_path() is not None else "none"
    with tempfile.TemporaryDirectory(prefix="grading-benchmark-") as tmp:
        folder = Path(tmp)
        _submissions(folder, count)
        serial = _grade(folder, 1, isolation)
        parallel = _grade(folder, 2, isolation)
    return {
        "seconds_per_notebook": serial["seconds_per_notebook"],
        "seconds_per_notebook_jobs_2": parallel["seconds_per_notebook"],
        "notebooks": count,
        "isolated": isolation == "required",
        "cores": os.cpu_count(),
        "serial": serial,
        "jobs_2": parallel,
    }


if __name__ == "__main__":  # pragma: no cover - a quick look: python -m attention_course.benchmarks.grading [N]
    import json
    import sys

    print(json.dumps(run(int(sys.argv[1]) if len(sys.argv) > 1 else NOTEBOOKS), indent=2))
