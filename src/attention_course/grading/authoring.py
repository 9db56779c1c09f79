"""Helpers for writing exercise notebooks from Python with the right tags and metadata.

An author who prefers Jupyter can set the tags and metadata by hand (``exercises/README.md``); an author who
writes notebooks from a script gets them right by construction::

    from attention_course.grading import authoring as a
    cells = [
        a.markdown("# Exercise 05: Scaling and masking\\n..."),
        a.setup_cell(),
        a.preamble_cell(EXERCISE.preamble),
        a.code('from attention_course.grading import exercise\\n\\ncheck = exercise("ex05")'),
        a.markdown("## Part 1: ..."),
        a.graded_cell("def f(x):\\n    ### BEGIN SOLUTION\\n    return x\\n    ### END SOLUTION", part="f"),
        a.check_cell("f"),
        a.solution_only_cell("check.assert_all_passed()"),
    ]
    a.write_solution_notebook("exercises/solutions/ex05_scaling_and_masking.ipynb", "ex05", cells)

then ``python -m attention_course.grading.generate`` writes the learner version.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

from attention_course.grading.generate import render
from attention_course.grading.notebook_format import (
    METADATA_KEY,
    TAG_CHECK,
    TAG_GRADED,
    TAG_HIDE_INPUT,
    TAG_PREAMBLE,
    TAG_SOLUTION_ONLY,
    normalize,
)

__all__ = [
    "check_cell",
    "code",
    "graded_cell",
    "markdown",
    "preamble_cell",
    "repository_url",
    "setup_cell",
    "solution_only_cell",
    "write_solution_notebook",
]


def repository_url(config: str | Path = "_config.yml") -> str:
    """``repository.url`` from the book's ``_config.yml``: the one place the repository is named."""
    text = Path(config).read_text(encoding="utf-8")
    match = re.search(r"^repository:\s*\n(?:[ \t]+.*\n)*?[ \t]+url:\s*(\S+)", text, re.MULTILINE)
    if match is None:
        raise ValueError(f"{config} has no repository.url")
    return match.group(1).strip("\"'").rstrip("/")


def markdown(source: str, tags: list[str] | None = None) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_markdown_cell(source.strip("\n"))
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def code(source: str, tags: list[str] | None = None, part: str | None = None) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source.strip("\n"))
    if tags:
        cell.metadata["tags"] = list(tags)
    if part is not None:
        cell.metadata[METADATA_KEY] = {"part": part}
    return cell


def setup_cell(config: str | Path = "_config.yml") -> nbformat.NotebookNode:
    """The Colab setup cell every notebook starts its code with, installing from ``repository.url``."""
    url = repository_url(config)
    return code(
        "import sys, subprocess\n"
        'if "google.colab" in sys.modules:  # on Colab: install the course package\n'
        f'    url = "attention-course @ git+{url}"\n'
        '    pip = [sys.executable, "-m", "pip"]\n'
        "    # Uninstall first: a re-run in a live runtime then installs the newest course code.\n"
        '    subprocess.run([*pip, "uninstall", "-qq", "-y", "attention-course"], check=True)\n'
        '    subprocess.run([*pip, "install", "-q", url], check=True)'
    )


def preamble_cell(preamble: str) -> nbformat.NotebookNode:
    """The imports cell; pass the exercise module's ``preamble`` so the two are identical."""
    return code(preamble.rstrip("\n"), [TAG_PREAMBLE])


def graded_cell(source: str, part: str) -> nbformat.NotebookNode:
    """The cell where the learner writes part ``part`` (collapsed on the website)."""
    return code(source, [TAG_GRADED, TAG_HIDE_INPUT], part)


def check_cell(part: str, function: str | None = None) -> nbformat.NotebookNode:
    """``check.<part>(<function>)``; ``function`` defaults to the part name."""
    return code(f"check.{part}({function or part})", [TAG_CHECK], part)


def solution_only_cell(source: str) -> nbformat.NotebookNode:
    """A code cell that exists only in the solution notebook."""
    return code(source, [TAG_SOLUTION_ONLY])


def write_solution_notebook(path: str | Path, exercise_id: str, cells: list[nbformat.NotebookNode]) -> None:
    """Write a solution notebook (python3 kernel, no outputs, nbstripout-clean) for exercise ``exercise_id``."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata[METADATA_KEY] = {"exercise": exercise_id}
    nb.cells = list(cells)
    normalize(nb)
    nbformat.validate(nb)
    Path(path).write_text(render(nb), encoding="utf-8")
