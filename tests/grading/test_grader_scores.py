"""The grader CLI on the real notebooks and on known-wrong implementations (one grader run for all)."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.grading.mutants import MUTANTS, write_mutants

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = sorted((ROOT / "exercises" / "solutions").glob("*.ipynb"))


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Copies of every solution and learner notebook, and every mutant, graded in one CLI call."""
    folder = tmp_path_factory.mktemp("submissions")
    for path in SOLUTIONS:
        shutil.copy(path, folder / f"solution__{path.name}")
        shutil.copy(ROOT / "exercises" / path.name, folder / f"learner__{path.name}")
    mutants = write_mutants(folder / "mutants")
    out = folder.parent / f"{folder.name}-results"
    command = [sys.executable, "-m", "attention_course.grading", str(folder), "--json", str(out / "grades.json"),
               "--csv", str(out / "grades.csv"), "--jobs", "2", "--timeout", "60"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr
    results = {Path(entry["path"]).name: entry for entry in json.loads((out / "grades.json").read_text())["notebooks"]}
    return {"results": results, "mutants": mutants, "stdout": run.stdout, "stderr": run.stderr,
            "csv": (out / "grades.csv").read_text()}


def parts(entry: dict) -> dict[str, dict]:
    return {part["name"]: part for part in entry["parts"]}


@pytest.mark.parametrize("name", [p.name for p in SOLUTIONS])
def test_solution_scores_full_marks(graded, name):
    entry = graded["results"][f"solution__{name}"]
    assert entry["max_score"] > 0 and entry["score"] == entry["max_score"], entry
    assert all(part["message"].startswith("all ") for part in entry["parts"])


@pytest.mark.parametrize("name", [p.name for p in SOLUTIONS])
def test_learner_notebook_scores_zero_cleanly(graded, name):
    entry = graded["results"][f"learner__{name}"]
    assert entry["score"] == 0 and entry["max_score"] > 0
    for part in entry["parts"]:
        assert part["score"] == 0 and part["message"], part
        assert "Traceback" not in part["message"]
    if entry["exercise"] != "bug_hunt":
        assert all(part["status"] == "not attempted" for part in entry["parts"])


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_loses_the_marks_of_its_part(graded, mutant):
    entry = graded["results"][f"{mutant.notebook}__{mutant.name}.ipynb"]
    part = parts(entry)[mutant.part]
    # Partial credit: the part keeps the cases the mistake does not touch, never all of them (and with
    # --all-or-nothing, a failed part scores 0: see test_all_or_nothing).
    assert part["status"] == "failed" and part["score"] < part["max_score"], f"{mutant.name} was not caught: {part}"
    if mutant.zero:  # right only on cases that cannot tell it apart: no credit at all (issue 23)
        assert part["score"] == 0, f"{mutant.name} kept {part['score']} of {part['max_score']}: {part}"
    assert any(not case["passed"] for case in part["cases"]) or not part["cases"]
    assert entry["score"] < entry["max_score"]
    assert "Traceback" not in part["message"]
    # Every failure says why in a kind of its own (the class summary counts them): none is left untyped.
    assert [case for case in part["cases"] if case["kind"] == "other"] == [], part


#: The failure kind the grader's JSON gives a few representative mutants' parts (the cause apart from the message):
#: each is the kind of the first case the mistake fails, the same on every draw of the cases.
EXPECTED_KINDS = {
    "kv_hard_returns_keys": "shape",
    "kv_soft_naive_exp": "not finite",
    "kv_soft_over_queries": "property",
    "kv_soft_no_beta": "known mistake",
    "one_query_ignores_weights": "mismatch",
    "equivariance_inverse_permutation": "known mistake",
    "matrix_dot_T": "error raised",
    "project_no_dk_check": "expected error",
    "rms_calls_torch_rms_norm": "forbidden call",
}


@pytest.mark.parametrize(("name", "kind"), EXPECTED_KINDS.items())
def test_mutants_fail_for_the_reason_they_should(graded, name, kind):
    mutant = next(m for m in MUTANTS if m.name == name)
    part = parts(graded["results"][f"{mutant.notebook}__{mutant.name}.ipynb"])[mutant.part]
    assert part["kind"] == kind, part
    assert kind in {case["kind"] for case in part["cases"]} or not part["cases"]


def test_there_are_enough_mutants():
    assert len(MUTANTS) >= 20
    assert {m.notebook for m in MUTANTS} >= {"ex02_hard_and_soft_attention", "ex_bug_hunt"}


def test_json_and_csv_agree(graded):
    rows = list(csv.DictReader(graded["csv"].splitlines()))
    assert len(rows) == len(graded["results"])
    for row in rows:
        entry = graded["results"][Path(row["path"]).name]
        assert float(row["score"]) == entry["score"] and int(row["max_score"]) == entry["max_score"]
        for part in entry["parts"]:
            assert float(row[f"{entry['exercise']}:{part['name']}"]) == part["score"]
    header = graded["csv"].splitlines()[0].split(",")
    assert header[:8] == ["path", "exercise", "score", "max_score", "message", "seconds", "learner_id", "name"]
    assert "ex02:soft_attention_weights reason" in header
    assert "ex02:soft_attention_weights" in header and "bug_hunt:dropout" in header


def test_stdout_has_a_score_table(graded):
    lines = graded["stdout"].splitlines()
    assert lines[0].split()[:4] == ["notebook", "exercise", "score", "parts"]
    assert any(line.split()[1:3] == ["ex02", "8/8"] for line in lines if "solution__ex02" in line)
    assert "Traceback" not in graded["stdout"] + graded["stderr"]
