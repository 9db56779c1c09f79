"""The README's recipe for a new lesson and its exercise, followed in a temporary copy of the course.

The test writes a minimal lesson and a minimal exercise solution notebook the way "Adding a lesson" and
"Adding an exercise" in README.md say, declares both in course.toml, runs the generator the README names
and then the structure and pitfall-index tests in the copy. Before the generator has run, the copy must fail
those tests (a notebook that course.toml does not list), so the test also proves the registry is what
the tests read.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from attention_course.grading import authoring
from tests.book import registry
from tests.notebooks.notebook_files import ROOT

COPIED = ["course.toml", "_toc.yml", "intro.md", "_config.yml", "pyproject.toml", "chapters", "exercises", "tests"]
LESSON = "chapters/99_recipe_check"
EXERCISE = "exercises/solutions/ex99_recipe_check"
STRUCTURE_TESTS = ["tests/notebooks/test_structure.py", "tests/notebooks/test_pitfalls_index.py"]
SELECTION = "recipe_check or registry or toc or up_to_date or there_are_notebooks"


def readme_steps(heading: str) -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"## {heading}" in readme, f"README.md has no section {heading!r}"
    return readme.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]


def minimal_lesson(root: Path) -> nbformat.NotebookNode:
    """The anatomy the README asks for, and nothing more."""
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook.cells = [
        authoring.markdown("# A recipe check\n\nLearning objectives: check that the README's recipe works."),
        authoring.setup_cell(root / "_config.yml"),
        authoring.code("import attention_course as ac\n\nac.seed_everything(0)"),
        authoring.markdown(":::{admonition} Common pitfall: following a recipe that skips a step\n"
                           ":class: warning\nEvery step counts.\n:::"),
        authoring.markdown("## Summary\n\nThe recipe works. Practise it in "
                           f"[its exercise](../{EXERCISE}.ipynb).\n\n## References\n\nNone."),
    ]
    for index, cell in enumerate(notebook.cells):
        cell.id = str(index)
    return notebook


def run_structure_tests(copy: Path, *selection: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-x", *selection]
    return subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_following_the_readme_adds_a_lesson_and_an_exercise(tmp_path):
    lesson_steps, exercise_steps = readme_steps("Adding a lesson"), readme_steps("Adding an exercise")
    # The steps this test follows are the ones the README gives.
    for step in ("course.toml", "[[parts.lessons]]", registry.COMMAND, "nbstripout"):
        assert step in lesson_steps, f"README's 'Adding a lesson' does not mention {step!r}"
    for step in ("exercise =", registry.COMMAND, "exercises/README.md", "make exercises"):
        assert step in exercise_steps, f"README's 'Adding an exercise' does not mention {step!r}"

    copy = tmp_path / "course"
    copy.mkdir()
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=shutil.ignore_patterns("__pycache__", "node_modules"))
        else:
            shutil.copy2(source, copy / name)

    # Step 1 of each recipe: the notebooks.
    nbformat.write(minimal_lesson(copy), copy / f"{LESSON}.ipynb")
    authoring.write_solution_notebook(copy / f"{EXERCISE}.ipynb", "ex99", [
        authoring.markdown("# Exercise 99: a recipe check\n\nNothing to do."),
        authoring.setup_cell(copy / "_config.yml"),
        authoring.solution_only_cell("print('done')"),
    ])
    # Without the registry entry the structure tests must fail, naming the unlisted notebook.
    unlisted = run_structure_tests(copy, "tests/notebooks/test_structure.py",
                                   "-k", "registry_lists_exactly")
    assert unlisted.returncode != 0 and "course.toml does not list it" in unlisted.stdout, unlisted.stdout[-3000:]

    # Step 2: the entry in course.toml; step 3: the generator.
    with open(copy / "course.toml", "a", encoding="utf-8") as registry_file:
        registry_file.write(
            '\n[[parts.lessons]]\n'
            f'file = "{LESSON}"\n'
            'number = "99"\n'
            'title = "A recipe check"\n'
            'builds = "nothing but a passing test"\n'
            f'exercise = "{EXERCISE}"\n'
        )
    generated = subprocess.run([sys.executable, "-m", "tests.book.registry"], cwd=copy, capture_output=True,
                               text=True, timeout=120)
    assert generated.returncode == 0, generated.stderr
    stripped = subprocess.run([str(Path(sys.executable).parent / "nbstripout"), "--verify",
                               f"{LESSON}.ipynb", f"{EXERCISE}.ipynb"], cwd=copy, capture_output=True, text=True)
    assert stripped.returncode == 0, stripped.stdout + stripped.stderr

    # What the generator wrote: the table of contents, the chapter map with its exercise link, the pitfalls.
    toc = (copy / "_toc.yml").read_text(encoding="utf-8")
    assert f"- file: {LESSON}\n" in toc and f"- file: {EXERCISE}\n" in toc
    intro = (copy / "intro.md").read_text(encoding="utf-8")
    assert f"| 99 | [A recipe check]({LESSON}.ipynb) |" in intro and f"]({EXERCISE}.ipynb)" in intro
    assert "following a recipe that skips a step ({doc}`99_recipe_check`)" in (
        copy / "chapters" / "pitfalls.md").read_text(encoding="utf-8")

    # The structure tests of the new notebooks, and every test that reads the registry or a generated page
    # (the other notebooks' own tests run in the main suite).
    result = run_structure_tests(copy, *STRUCTURE_TESTS, "-vv", "-k", SELECTION)  # -vv over -q: one line a test
    assert result.returncode == 0, result.stdout[-5000:]
    assert "99_recipe_check" in result.stdout and "ex99_recipe_check" in result.stdout, result.stdout[-3000:]
