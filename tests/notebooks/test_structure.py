"""Every notebook is shaped as the course promises: setup cell first, stripped, python3 kernel."""

from __future__ import annotations

import re

import pytest

from attention_course.grading import authoring
from tests.book import registry
from tests.notebooks.notebook_files import ALL_NOTEBOOKS, LESSONS, ROOT, SOLUTIONS, read, relative

SETUP_LINES = (
    "import sys, subprocess",
    'if "google.colab" in sys.modules:',
)


def expected_install_target(repository_url: str) -> str:
    return f"attention-course @ git+{repository_url}"


def first_code_cell(notebook) -> str:
    for cell in notebook.cells:
        if cell.cell_type == "code":
            return cell.source
    raise AssertionError("notebook has no code cell")


def test_there_are_notebooks_to_check():
    # Guards every parametrised test below against silently checking nothing.
    assert len(LESSONS) >= 1 and len(SOLUTIONS) >= 1, (LESSONS, SOLUTIONS)


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=relative)
def test_first_code_cell_is_the_colab_setup_cell(path, repository_url):
    source = first_code_cell(read(path))
    for line in SETUP_LINES:
        assert line in source, f"{relative(path)}: the first code cell must be the Colab setup cell (missing {line!r})"
    installs = re.findall(r'"([^"]*@ git\+[^"]*)"', source)
    # One setup cell everywhere, the one the exercise generator writes (it uninstalls first, so that a
    # re-run in a live Colab runtime picks up the newest course code).
    assert source == authoring.setup_cell(ROOT / "_config.yml").source, (
        f"{relative(path)}: the setup cell differs from attention_course.grading.authoring.setup_cell()"
    )
    assert installs == [expected_install_target(repository_url)], (
        f"{relative(path)}: the setup cell installs {installs}, but _config.yml's repository.url says "
        f"{expected_install_target(repository_url)!r}"
    )


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=relative)
def test_notebook_is_stripped_and_uses_python3(path):
    notebook = read(path)
    assert notebook.metadata.get("kernelspec", {}).get("name") == "python3", f"{relative(path)}: kernel is not python3"
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{relative(path)} cell {index} has outputs: commit notebooks stripped"
            assert cell.execution_count is None, f"{relative(path)} cell {index} has an execution count"


@pytest.mark.parametrize("path", LESSONS, ids=relative)
def test_lesson_follows_the_anatomy(path):
    """A lesson has a title, objectives, the library import, a seed, a summary and references."""
    notebook = read(path)
    markdown = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")
    code = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    assert notebook.cells[0].cell_type == "markdown" and notebook.cells[0].source.startswith("# "), (
        f"{relative(path)}: the first cell must be the title"
    )
    for heading in ("## Summary", "## References"):
        assert heading in markdown, f"{relative(path)}: missing section {heading!r}"
    assert re.search(r"learning objectives", markdown, re.IGNORECASE), f"{relative(path)}: no learning objectives"
    assert "import attention_course as ac" in code, f"{relative(path)}: lessons use the course library"
    assert "ac.seed_everything(" in code, f"{relative(path)}: lessons seed through the library"
    assert ".cuda()" not in code, f"{relative(path)}: pick devices with ac.get_device(), never .cuda()"


@pytest.mark.parametrize("path", LESSONS, ids=relative)
def test_every_figure_cell_has_alt_text(path):
    """A cell that draws a figure carries alt text in its metadata (mystnb.image.alt)."""
    notebook = read(path)
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code" or "plt.show()" not in cell.source:
            continue
        if "widgets.interact" in cell.source or re.search(r"^\s+plt\.show\(\)", cell.source, re.MULTILINE):
            # A plt.show() inside a function body draws when the function is called: a widget callback, or a
            # helper whose calling cell is checked instead.
            continue
        alt = cell.metadata.get("mystnb", {}).get("image", {}).get("alt", "")
        assert len(alt) >= 40, f"{relative(path)} cell {index} draws a figure without descriptive alt text"


@pytest.mark.parametrize("path", LESSONS, ids=relative)
def test_interactive_figures_use_the_course_helper(path):
    """Controls come from ac.interactive_figure, which also works on the static website (precomputed
    frames); a bare ipywidgets control would move on the site while its figure stays put."""
    notebook = read(path)
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        bare = re.search(r"^\s*(import ipywidgets|from ipywidgets|.*\binteract(ive)?\()", cell.source, re.MULTILINE)
        assert not bare or "interactive_figure(" in bare.group(0), (
            f"{relative(path)} cell {index} uses ipywidgets directly ({bare.group(0).strip()!r}); "
            "use ac.interactive_figure(draw, alt, **controls)"
        )


# The website's code column shows 88 characters without scrolling (ruff format's line length).
MAX_CODE_LINE = 88


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=relative)
def test_code_lines_fit_the_column(path):
    long_lines = [
        f"cell {index}: {len(line)} characters: {line[:60]}..."
        for index, cell in enumerate(read(path).cells)
        if cell.cell_type == "code"
        for line in cell.source.splitlines()
        if len(line) > MAX_CODE_LINE
    ]
    assert not long_lines, f"{relative(path)}: code lines over {MAX_CODE_LINE} characters:\n" + "\n".join(
        long_lines[:10]
    )


def test_registry_lists_exactly_the_notebooks_that_exist():
    """course.toml names every lesson and exercise solution, and nothing that does not exist."""
    course = registry.load(ROOT)
    listed = [lesson.file for lesson in course.lessons] + list(course.exercises) + list(course.reference)
    duplicated = sorted({entry for entry in listed if listed.count(entry) > 1})
    assert not duplicated, f"course.toml lists {duplicated} more than once"
    for path in LESSONS + SOLUTIONS:
        stem = relative(path).removesuffix(".ipynb")
        assert stem in listed, f"{relative(path)} exists but course.toml does not list it (see README: Adding a lesson)"
    for entry in listed:
        assert registry.notebook_or_page(ROOT, entry), f"course.toml lists {entry}, which does not exist"
    numbers = [lesson.number for lesson in course.lessons]
    assert len(set(numbers)) == len(numbers), f"course.toml gives two lessons the same number: {numbers}"


@pytest.mark.parametrize("lesson", [lesson for lesson in registry.load(ROOT).lessons if lesson.exercise],
                         ids=lambda lesson: lesson.stem)
def test_lesson_links_the_exercise_the_registry_gives_it(lesson):
    """The lesson's closing link and the chapter map's point at the same exercise."""
    notebook = read(ROOT / f"{lesson.file}.ipynb")
    markdown = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")
    assert lesson.exercise in markdown, f"{lesson.file} does not link its exercise {lesson.exercise} (course.toml)"


@pytest.mark.parametrize("path", sorted(registry.generated_files(ROOT)), ids=relative)
def test_generated_parts_are_up_to_date_with_the_registry(path):
    assert path.read_text(encoding="utf-8") == registry.generated_files(ROOT)[path], (
        f"{relative(path)} is out of date with course.toml: run {registry.COMMAND}"
    )


def test_toc_is_what_the_book_reads():
    """_toc.yml, written from course.toml, lists the root page and every lesson and solution."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    listed = {toc["root"]}
    for part in toc["parts"]:
        listed.update(chapter["file"] for chapter in part["chapters"])
    for path in LESSONS + SOLUTIONS:
        assert relative(path).removesuffix(".ipynb") in listed, f"{relative(path)} is not in _toc.yml"


DEEP_IMPORT = re.compile(r"^\s*(from\s+attention_course[\w.]*\s+import|import\s+attention_course\.)", re.MULTILINE)


@pytest.mark.parametrize("path", LESSONS, ids=relative)
def test_lesson_uses_the_library_only_through_ac(path):
    """One face: a lesson imports ``attention_course as ac`` and nothing deeper, and every ``ac.<name>``
    it uses exists (a helper that is not exported is shown with ``ac.show("module.name")``)."""
    import attention_course

    code = "\n".join(cell.source for cell in read(path).cells if cell.cell_type == "code")
    deep = [match.group(0).strip() for match in DEEP_IMPORT.finditer(code)]
    assert not deep, f"{relative(path)} imports from inside the library: {deep}; use ac.<name>"
    for chain in sorted(set(re.findall(r"(?<![\w.])ac((?:\.[A-Za-z_]\w*)+)", code))):
        obj = attention_course
        for attribute in chain.lstrip(".").split("."):
            assert hasattr(obj, attribute), f"{relative(path)} uses ac{chain}, which the library does not have"
            obj = getattr(obj, attribute)
            if not isinstance(obj, type(attention_course)):
                break  # ac.<name>.<method>: the name exists; what follows is the object's business
