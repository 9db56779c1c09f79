"""Which notebooks the course has, and how to read them."""

from __future__ import annotations

from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]

LESSONS = sorted((ROOT / "chapters").glob("*.ipynb"))
SOLUTIONS = sorted((ROOT / "exercises" / "solutions").glob("*.ipynb"))
LEARNER_EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))
ALL_NOTEBOOKS = LESSONS + SOLUTIONS + LEARNER_EXERCISES


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()
