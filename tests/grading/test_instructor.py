"""The instructor's side: roster, CSV with reasons and times, class summary, feedback files, all-or-nothing,
a notebook of another exercise, and the Gradescope export (results.json checked against its documented
format)."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from attention_course.grading import get_exercise
from attention_course.grading.gradescope import run as gradescope_run
from attention_course.grading.gradescope import write_bundle
from tests.grading.mutants import MUTANTS, write_mutants

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "exercises" / "solutions"
EX02 = "ex02_hard_and_soft_attention.ipynb"
EX06 = "ex06_multi_head_attention.ipynb"

# Gradescope's results.json, as its autograder specification documents it: a top-level score (optional
# when the tests carry scores), execution_time, output, visibility, stdout_visibility, and tests, each with
# score, max_score, status, name, number, output, tags, visibility.
GRADESCOPE_SCHEMA = {
    "type": "object",
    "properties": {
        "score": {"type": "number"},
        "execution_time": {"type": "number"},
        "output": {"type": "string"},
        "visibility": {"enum": ["hidden", "after_due_date", "after_published", "visible"]},
        "stdout_visibility": {"enum": ["hidden", "after_due_date", "after_published", "visible"]},
        "tests": {"type": "array", "items": {
            "type": "object",
            "properties": {
                "score": {"type": "number"}, "max_score": {"type": "number"},
                "status": {"enum": ["passed", "failed"]}, "name": {"type": "string"},
                "number": {"type": "string"}, "output": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "visibility": {"enum": ["hidden", "after_due_date", "after_published", "visible"]},
            },
            "required": ["score", "max_score", "name", "output"],
            "additionalProperties": False,
        }},
    },
    "required": ["tests"],
    "additionalProperties": False,
}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attention_course.grading", *args], capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """A small class: two learners (by e-mail folder), a mutant, and an ex06 notebook in the ex02 folder."""
    folder = tmp_path_factory.mktemp("class")
    (folder / "ada@uni.edu").mkdir()
    shutil.copy(SOLUTIONS / EX02, folder / "ada@uni.edu" / EX02)
    (folder / "bob@uni.edu").mkdir()
    mutant = next(m for m in MUTANTS if m.name == "soft_wrong_axis")
    written = write_mutants(folder / "bob@uni.edu", [mutant])
    shutil.copy(SOLUTIONS / EX06, folder / "ex02_from_carol.ipynb")  # metadata says ex06
    roster = folder.parent / f"{folder.name}-roster.csv"
    roster.write_text("email,file,learner_id,name\nada@uni.edu,,s001,Ada L.\nbob@uni.edu,,s002,Bob M.\n"
                      ",ex02_from_carol.ipynb,s003,Carol N.\ndan@uni.edu,,s004,Dan O.\n", encoding="utf-8")
    out = folder.parent / f"{folder.name}-out"
    run = _cli(str(folder), "--roster", str(roster), "--csv", str(out / "grades.csv"), "--json",
               str(out / "grades.json"), "--summary", str(out / "summary"), "--feedback", str(out / "feedback"),
               "--seed", "7", "--quiet", "--jobs", "2")
    assert run.returncode == 0, run.stderr
    forced = _cli(str(folder / "ex02_from_carol.ipynb"), str(folder / "bob@uni.edu" / next(iter(written))), "--exercise", "ex02", "--all-or-nothing",
                  "--json", str(out / "forced.json"), "--seed", "7")
    assert forced.returncode == 0, forced.stderr
    rows = {row["learner_id"]: row for row in csv.DictReader((out / "grades.csv").read_text().splitlines())}
    return {"out": out, "rows": rows, "stdout": run.stdout, "mutant": mutant,
            "forced": json.loads((out / "forced.json").read_text())["notebooks"]}


def test_roster_names_each_learner_and_csv_has_times_and_reasons(graded):
    rows = graded["rows"]
    assert set(rows) == {"s001", "s002", "s003"}
    assert rows["s001"]["name"] == "Ada L." and float(rows["s001"]["score"]) == 8
    bob = rows["s002"]
    part = graded["mutant"].part
    assert 0 <= float(bob[f"ex02:{part}"]) < 2 and "row" in bob[f"ex02:{part} reason"]
    assert bob["ex02:attention_pooling reason"] == ""
    assert all(float(row["seconds"]) > 0 for row in rows.values())
    assert "s002" in graded["stdout"]


def test_a_notebook_of_another_exercise_is_warned_about_and_refused_with_exercise(graded):
    carol = graded["rows"]["s003"]  # graded by its metadata, with a warning about the file name
    assert carol["exercise"] == "ex06"
    assert "the file name suggests ex02, but the notebook's metadata names ex06" in carol["message"]
    refused = next(entry for entry in graded["forced"] if entry["path"].endswith("ex02_from_carol.ipynb"))
    assert refused["score"] == 0
    assert "this notebook is exercise ex06 (its metadata says so), not ex02" in refused["message"]


def test_all_or_nothing_gives_a_failed_part_no_points(graded):
    entry = next(entry for entry in graded["forced"] if "soft_wrong_axis" in entry["path"])
    part = next(p for p in entry["parts"] if p["name"] == graded["mutant"].part)
    assert part["status"] == "failed" and part["score"] == 0
    assert any(case["passed"] for case in part["cases"])  # it would have had partial credit


def test_class_summary_and_histogram(graded):
    summary = (graded["out"] / "summary" / "summary.md").read_text()
    assert "## ex02" in summary and "| soft_attention_weights |" in summary and "pass rate" in summary
    # The roster's learner who sent nothing is listed; each part's commonest reasons for losing marks follow.
    assert "Missing: 1 of the roster's 4 learners sent no notebook" in summary and "- s004 (Dan O.)" in summary
    assert "no notebook from 1 learner(s) of the roster: s004 (Dan O.)" in graded["stdout"]
    part = graded["mutant"].part
    assert f"- {part}:\n  1. (1) " in summary and "- attention_pooling: no failures." in summary
    png = graded["out"] / "summary" / "scores.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_one_feedback_file_per_learner_with_failed_cases_and_hints(graded):
    files = sorted(path.name for path in (graded["out"] / "feedback").iterdir())
    assert files == ["s001.md", "s002.md", "s003.md"]
    bob = (graded["out"] / "feedback" / "s002.md").read_text()
    part = get_exercise("ex02").part(graded["mutant"].part)
    assert "Bob M." in bob and f"## {part.name}" in bob and "Hint (concept):" in bob
    assert part.hints[0] in bob
    assert part.hints[1] not in bob and "Hint 2" not in bob  # the approach only with --feedback-approach-hints
    assert "## attention_pooling" not in bob  # passed parts get no section


def test_gradescope_results_follow_the_documented_format(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    submission = tmp_path / "submission"
    submission.mkdir()
    write_mutants(submission, [next(m for m in MUTANTS if m.name == "soft_wrong_axis")])
    results = gradescope_run("ex02", submission, tmp_path / "results" / "results.json")
    written = json.loads((tmp_path / "results" / "results.json").read_text())
    assert written == results
    jsonschema.validate(written, GRADESCOPE_SCHEMA)
    exercise = get_exercise("ex02")
    assert [test["name"] for test in written["tests"]] == [part.name for part in exercise.parts]
    assert sum(test["max_score"] for test in written["tests"]) == exercise.max_score
    assert written["score"] == pytest.approx(sum(test["score"] for test in written["tests"]))
    failed = {test["name"]: test for test in written["tests"] if test["status"] == "failed"}
    assert set(failed) == {"soft_attention_weights", "self_attention_no_projections"}
    assert "FAIL" in failed["soft_attention_weights"]["output"]
    assert failed["self_attention_no_projections"]["output"].startswith(
        "part 4 uses your soft_attention_weights from part 2, which fails; fix part 2 first.")


def test_gradescope_bundle_has_setup_run_package_and_exercise(tmp_path):
    archive = write_bundle("ex04", tmp_path / "ex04-autograder")
    names = set(zipfile.ZipFile(archive).namelist())
    # Gradescope extracts the zip into /autograder/source: the scripts at its root, the package beside them.
    assert {"setup.sh", "run_autograder", "package/pyproject.toml", "ex04_queries_keys_values.ipynb",
            "package/src/attention_course/grading/exercises/ex04.py"} <= names
    assert "/autograder/venv/bin/python -m pip install /autograder/source/package\n" in (
        tmp_path / "ex04-autograder" / "setup.sh").read_text()
    run = (tmp_path / "ex04-autograder" / "run_autograder").read_text()
    assert 'gradescope run ex04 "$SUBMISSION" "$RESULTS"' in run
    assert "SUBMISSION=/autograder/submission\nRESULTS=/autograder/results/results.json\n" in run
    assert (tmp_path / "ex04-autograder" / "run_autograder").stat().st_mode & 0o111


def test_csv_cells_that_a_spreadsheet_would_run_are_text():
    """Issue 42: a file named =HYPERLINK(...).ipynb landed verbatim in the CSV. Every text cell that starts
    with =, +, -, @, a tab or a carriage return now gets a leading apostrophe; numbers stay numbers."""
    from attention_course.grading.grader import NotebookResult
    from attention_course.grading.report import to_csv

    results = [NotebookResult(start + "x.ipynb", "ex02", 3, 8, message=start + "message", seconds=1.5)
               for start in ("=", "+", "-", "@", "\t", "\r", "plain ")]
    rows = list(csv.reader(io.StringIO(to_csv(results), newline="")))
    for row in rows[1:]:
        assert row[0].startswith(("'", "plain")) and row[4].startswith(("'", "plain")), row
        assert row[2] == "3" and row[5] == "1.50"
