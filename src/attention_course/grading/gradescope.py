"""Grade on Gradescope: an autograder bundle, and the ``results.json`` its run writes.

``python -m attention_course.grading.gradescope bundle EXERCISE OUT`` writes ``OUT/`` and ``OUT.zip`` (upload
the zip as the assignment's autograder): ``setup.sh`` (installs Python, CPU PyTorch, bubblewrap and the
course package), ``run_autograder`` (grades the learner's notebook), and ``source/`` with the package and
the exercise's learner notebook.

``python -m attention_course.grading.gradescope run EXERCISE SUBMISSION_DIR RESULTS_JSON`` is what
``run_autograder`` calls: it grades the one notebook in ``SUBMISSION_DIR`` as ``EXERCISE`` and writes
Gradescope's results format (one test per part: ``name``, ``score``, ``max_score``, ``status``, ``output``
with each case's verdict; the top level ``score``, ``execution_time`` and ``output``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import stat
import sys
import time
from pathlib import Path
from typing import Any

from attention_course.grading.exercises import exercise_ids

__all__ = ["gradescope_results", "write_bundle", "main"]

_SETUP = """\
#!/usr/bin/env bash
# Gradescope runs this once, as root, to build the autograder image.
set -euo pipefail
apt-get update
apt-get install -y python3 python3-pip python3-venv bubblewrap
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install --upgrade pip
/autograder/venv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu
/autograder/venv/bin/pip install /autograder/source/package
"""

_RUN = """\
#!/usr/bin/env bash
# Gradescope runs this for every submission; it must write /autograder/results/results.json.
set -uo pipefail
mkdir -p /autograder/results
SUBMISSION=/autograder/submission
RESULTS=/autograder/results/results.json
cd /autograder
/autograder/venv/bin/python -m attention_course.grading.gradescope run {exercise} "$SUBMISSION" "$RESULTS"
"""


def _output(verdict: Any) -> str:
    lines = [verdict.cause + "." if verdict.cause else "", verdict.message]
    lines += [f"PASS  {case.name}" if case.passed else f"FAIL  {case.name}: {case.message}" for case in verdict.cases]
    return "\n".join(line for line in lines if line)


def gradescope_results(result: Any, seconds: float | None = None) -> dict[str, Any]:
    """Gradescope's ``results.json`` for one graded notebook (a
    :class:`~attention_course.grading.grader.NotebookResult`): one test per part."""
    tests = [
        {"name": verdict.part, "number": str(number), "score": verdict.score, "max_score": verdict.max_score,
         "status": "passed" if verdict.passed else "failed", "output": _output(verdict), "visibility": "visible"}
        for number, verdict in enumerate(result.parts, start=1)
    ]
    output = f"{result.exercise}: {result.score:g} of {result.max_score} points."
    if result.message:
        output += f" {result.message}"
    return {"score": result.score, "execution_time": round(seconds if seconds is not None else result.seconds, 2),
            "output": output, "visibility": "visible", "stdout_visibility": "hidden", "tests": tests}


def _notebook_in(folder: Path) -> Path | str:
    found = sorted(path for path in folder.rglob("*.ipynb") if ".ipynb_checkpoints" not in path.parts)
    if len(found) != 1:
        return f"expected exactly one .ipynb notebook in the submission, found {len(found)}"
    return found[0]


def run(exercise_id: str, submission: Path, results_path: Path, timeout: float = 60.0,
        isolation: str = "auto") -> dict[str, Any]:
    """Grade the submission's notebook and write ``results_path``; returns what was written.

    ``isolation="auto"`` uses bubblewrap where the container allows it; Gradescope runs every submission in
    a fresh container of its own, which is the boundary that matters there."""
    from attention_course.grading.grader import grade_notebook

    started = time.monotonic()
    notebook = _notebook_in(submission)
    if isinstance(notebook, str):
        results: dict[str, Any] = {"score": 0, "execution_time": 0, "output": notebook, "tests": []}
    else:
        result = grade_notebook(notebook, timeout=timeout, exercise_id=exercise_id, isolation=isolation)
        results = gradescope_results(result, time.monotonic() - started)
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return results


def _package_root() -> Path:
    import attention_course

    return Path(attention_course.__file__).resolve().parents[2]


def write_bundle(exercise_id: str, out: Path) -> Path:
    """Write the autograder folder ``out`` and ``out.zip`` for ``exercise_id``; returns the zip's path."""
    if exercise_id not in exercise_ids():
        raise ValueError(f"unknown exercise {exercise_id!r}; known: {exercise_ids()}")
    root = _package_root()
    if out.exists():
        shutil.rmtree(out)
    package = out / "source" / "package"
    package.mkdir(parents=True)
    shutil.copy(root / "pyproject.toml", package / "pyproject.toml")
    for name in ("README.md", "LICENSE"):
        if (root / name).exists():
            shutil.copy(root / name, package / name)
    shutil.copytree(root / "src" / "attention_course", package / "src" / "attention_course",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for notebook in (root / "exercises").glob("*.ipynb"):
        from attention_course.grading.grader import guess_exercise

        if guess_exercise(notebook) == exercise_id:
            shutil.copy(notebook, out / "source" / notebook.name)
    for name, text in (("setup.sh", _SETUP), ("run_autograder", _RUN.format(exercise=exercise_id))):
        path = out / name
        path.write_text(text, encoding="utf-8")
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    archive = shutil.make_archive(str(out), "zip", root_dir=out)
    return Path(archive)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attention_course.grading.gradescope",
                                     description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    bundle = commands.add_parser("bundle", help="write an autograder bundle (folder and zip)")
    bundle.add_argument("exercise", choices=exercise_ids())
    bundle.add_argument("out", type=Path, help="folder to write; OUT.zip is written next to it")
    grade = commands.add_parser("run", help="grade a submission folder and write results.json")
    grade.add_argument("exercise", choices=exercise_ids())
    grade.add_argument("submission", type=Path)
    grade.add_argument("results", type=Path)
    grade.add_argument("--timeout", type=float, default=60.0)
    grade.add_argument("--isolation", choices=["required", "auto", "none"], default="auto",
                       help="bubblewrap: required, where available (default), or none")
    args = parser.parse_args(argv)
    if args.command == "bundle":
        print(f"wrote {write_bundle(args.exercise, args.out)}: upload it as the autograder of {args.exercise}")
        return 0
    results = run(args.exercise, args.submission, args.results, args.timeout, args.isolation)
    print(results["output"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
