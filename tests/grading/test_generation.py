"""The exercise format: solution markers, learner-notebook generation (in sync, idempotent), structure."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from attention_course.grading import authoring, get_exercise
from attention_course.grading.exercises import exercise_ids
from attention_course.grading.generate import generate, learner_notebook, main
from attention_course.grading.notebook_format import (
    BEGIN_SOLUTION,
    END_SOLUTION,
    TAG_CHECK,
    TAG_GRADED,
    TAG_HIDE_INPUT,
    TAG_PREAMBLE,
    TAG_SOLUTION_ONLY,
    cell_part,
    cell_tags,
    check_cell_id,
    graded_cell_id,
    learner_markdown,
    learner_source,
    notebook_exercise,
)

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = sorted((ROOT / "exercises" / "solutions").glob("*.ipynb"))
LEARNERS = [ROOT / "exercises" / path.name for path in SOLUTIONS]


def names(paths: list[Path]) -> list[str]:
    return [path.name for path in paths]


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


# --- markers -----------------------------------------------------------------------------------------
def test_solution_block_becomes_a_stub_at_its_indentation():
    source = "def f(x):\n    \"\"\"Doc.\"\"\"\n    # hint: square it\n    ### BEGIN SOLUTION\n    y = x * x\n" \
             "    return y\n    ### END SOLUTION\n"
    assert learner_source(source) == (
        "def f(x):\n    \"\"\"Doc.\"\"\"\n    # hint: square it\n    # YOUR CODE HERE\n"
        "    raise NotImplementedError(\"replace this line with your code\")\n"
    )


def test_buggy_block_becomes_the_starting_code():
    source = ("def f(q, k):\n    ### BEGIN SOLUTION\n    return q @ k.transpose(-2, -1)\n    ### BUGGY\n"
              "    # for i in range(3):\n    #     pass\n    # return q @ k.T\n    ### END SOLUTION")
    assert learner_source(source) == "def f(q, k):\n    for i in range(3):\n        pass\n    return q @ k.T"


def test_empty_buggy_block_removes_the_fix():
    source = "x = 1\n### BEGIN SOLUTION\nx = 2\n### BUGGY\n### END SOLUTION\nprint(x)"
    assert learner_source(source) == "x = 1\nprint(x)"


def test_several_blocks_in_one_cell():
    source = "### BEGIN SOLUTION\na = 1\n### END SOLUTION\nb = 2\n### BEGIN SOLUTION\nc = 3\n### END SOLUTION"
    stub = 'raise NotImplementedError("replace this line with your code")'
    assert learner_source(source) == f"# YOUR CODE HERE\n{stub}\nb = 2\n# YOUR CODE HERE\n{stub}"


@pytest.mark.parametrize("source, problem", [
    ("### BEGIN SOLUTION\nx = 1\n", "without ### END SOLUTION"),
    ("x = 1\n### END SOLUTION\n", "without ### BEGIN SOLUTION"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n", "nested"),
    ("### BEGIN SOLUTION\nx = 1\n### BUGGY\nx = 2\n### END SOLUTION\n", "must be commented out"),
    ("### BEGIN SOLUTION\n### BUGGY\n### BUGGY\n### END SOLUTION\n", "two ### BUGGY"),
])
def test_malformed_markers_are_reported_with_the_cell(source, problem):
    with pytest.raises(ValueError, match=problem) as info:
        learner_source(source, where="nb.ipynb, cell 7")
    assert "nb.ipynb, cell 7" in str(info.value)


def test_markdown_answers_are_replaced():
    text = "Why?\n\n### BEGIN SOLUTION\nBecause softmax is shift invariant.\n### END SOLUTION\nNext."
    assert learner_markdown(text) == "Why?\n\n*Write your answer here.*\nNext."


# --- generation --------------------------------------------------------------------------------------
def test_there_are_exercises():
    assert {"ex02_hard_and_soft_attention.ipynb", "ex_bug_hunt.ipynb"} <= set(names(SOLUTIONS))


def test_committed_learner_notebooks_are_in_sync_with_their_solutions():
    stale = generate(ROOT / "exercises" / "solutions", ROOT / "exercises", check=True)
    assert stale == [], f"run `python -m attention_course.grading.generate`: out of date: {stale}"


def test_generation_is_idempotent(tmp_path):
    first = generate(ROOT / "exercises" / "solutions", tmp_path)
    assert sorted(p.name for p in first) == names(SOLUTIONS)
    texts = {p.name: p.read_text() for p in tmp_path.glob("*.ipynb")}
    assert generate(ROOT / "exercises" / "solutions", tmp_path) == []
    assert {p.name: p.read_text() for p in tmp_path.glob("*.ipynb")} == texts


def test_check_mode_reports_a_stale_notebook_and_writes_nothing(tmp_path, capsys):
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    (solutions / SOLUTIONS[0].name).write_text(SOLUTIONS[0].read_text())
    assert main(["--solutions", str(solutions), "--out", str(tmp_path), "--check"]) == 1
    assert not (tmp_path / SOLUTIONS[0].name).exists()
    assert main(["--solutions", str(solutions), "--out", str(tmp_path)]) == 0
    assert main(["--solutions", str(solutions), "--out", str(tmp_path), "--check"]) == 0
    (tmp_path / SOLUTIONS[0].name).write_text("{}")
    assert main(["--solutions", str(solutions), "--out", str(tmp_path), "--check"]) == 1
    assert "out of date" in capsys.readouterr().out


def test_generation_needs_the_exercise_metadata():
    nb = read(SOLUTIONS[0])
    del nb.metadata["grading"]
    with pytest.raises(ValueError, match="grading"):
        learner_notebook(nb, name="x.ipynb")


# --- structure of every exercise notebook --------------------------------------------------------------
@pytest.mark.parametrize("path", SOLUTIONS, ids=names(SOLUTIONS))
def test_solution_notebook_structure(path):
    nb = read(path)
    exercise = get_exercise(notebook_exercise(nb))
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    assert code_cells[0].source == authoring.setup_cell(ROOT / "_config.yml").source
    assert nb.metadata.kernelspec.name == "python3"
    preambles = [c for c in code_cells if TAG_PREAMBLE in cell_tags(c)]
    assert [c.source + "\n" for c in preambles] == [exercise.preamble], "the preamble cell must equal PREAMBLE"
    for part in exercise.parts:
        graded = [c for c in code_cells if TAG_GRADED in cell_tags(c) and cell_part(c) == part.name]
        checks = [c for c in code_cells if TAG_CHECK in cell_tags(c) and cell_part(c) == part.name]
        assert len(graded) == 1, f"{path.name}: part {part.name} needs exactly one graded cell"
        assert TAG_HIDE_INPUT in cell_tags(graded[0]), f"{path.name}: solution cells start collapsed on the site"
        assert BEGIN_SOLUTION in graded[0].source and END_SOLUTION in graded[0].source
        assert f"def {part.function}(" in graded[0].source or f"class {part.function}(" in graded[0].source
        assert [c.source for c in checks] == [f"check.{part.name}({part.function})"]
    tagged = {cell_part(c) for c in code_cells if TAG_GRADED in cell_tags(c)}
    assert tagged == {part.name for part in exercise.parts}, "every graded cell belongs to a part"
    assert any(c.source == "check.assert_all_passed()" and TAG_SOLUTION_ONLY in cell_tags(c) for c in code_cells)


@pytest.mark.parametrize("path", LEARNERS, ids=names(LEARNERS))
def test_learner_notebook_holds_no_solution(path):
    nb = read(path)
    exercise = get_exercise(notebook_exercise(nb))
    for index, cell in enumerate(nb.cells):
        assert BEGIN_SOLUTION not in cell.source and "### BUGGY" not in cell.source, f"cell {index}"
        assert not {TAG_SOLUTION_ONLY, TAG_HIDE_INPUT} & set(cell_tags(cell)), f"cell {index}"
        if cell.cell_type == "code":
            compile(cell.source, f"{path.name} cell {index}", "exec")  # valid Python for the learner
            assert cell.outputs == [] and cell.execution_count is None
            known = {TAG_GRADED: graded_cell_id, TAG_CHECK: check_cell_id}
            made = [make(cell_part(cell)) for tag, make in known.items() if tag in cell_tags(cell)]
            assert cell.id == (made[0] if made else str(index)), "ids: as nbstripout numbers them, but known "\
                "ids for the graded and check cells"
    graded = {cell_part(c): c.source for c in nb.cells if TAG_GRADED in cell_tags(c)}
    assert set(graded) == {part.name for part in exercise.parts}
    solution = {cell_part(c): c.source for c in read(path.parent / "solutions" / path.name).cells
                if TAG_GRADED in cell_tags(c)}
    for part, source in graded.items():
        assert source != solution[part]
        if exercise.id != "bug_hunt":
            assert "raise NotImplementedError" in source


def test_every_exercise_module_has_a_solution_notebook():
    found = {notebook_exercise(read(path)) for path in SOLUTIONS}
    assert set(exercise_ids()) <= found, f"exercise modules without a solution notebook: {set(exercise_ids()) - found}"
