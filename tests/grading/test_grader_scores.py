"""The grader CLI on the real notebooks and on known-wrong implementations (one grader run for all).

The mutants travel in groups (:func:`tests.grading.mutants.pack`): one notebook holds several mutants of one
exercise, each in its own part and none in a part linked to another's, so each part's verdict is its mutant's
alone. A notebook costs a sandbox start (importing PyTorch); grouping grades about half as many notebooks as one
per mutant, and every test below still judges each mutant on its own part.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.grading.mutants import MUTANTS, linked_parts, write_packed_mutants

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = sorted((ROOT / "exercises" / "solutions").glob("*.ipynb"))


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Copies of every solution and learner notebook, and every mutant, graded in one CLI call."""
    folder = tmp_path_factory.mktemp("submissions")
    for path in SOLUTIONS:
        shutil.copy(path, folder / f"solution__{path.name}")
        shutil.copy(ROOT / "exercises" / path.name, folder / f"learner__{path.name}")
    groups = write_packed_mutants(folder / "mutants")
    out = folder.parent / f"{folder.name}-results"
    # --timeout bounds a cell's or a part's wall time; it is generous so that a loaded machine cannot turn a
    # correct part into a time-limit failure (the verdicts judged here are about what the code computes).
    command = [sys.executable, "-m", "attention_course.grading", str(folder), "--json", str(out / "grades.json"),
               "--csv", str(out / "grades.csv"), "--jobs", "2", "--timeout", "120"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=3600)  # a hang guard, not a budget
    assert run.returncode == 0, run.stderr
    results = {Path(entry["path"]).name: entry for entry in json.loads((out / "grades.json").read_text())["notebooks"]}
    where = {mutant.name: name for name, group in groups.items() for mutant in group}
    return {"results": results, "groups": groups, "where": where, "stdout": run.stdout, "stderr": run.stderr,
            "csv": (out / "grades.csv").read_text()}


def mutant_entry(graded: dict, mutant) -> dict:
    """The grader's result for the notebook that holds ``mutant``."""
    return graded["results"][graded["where"][mutant.name]]


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
    entry = mutant_entry(graded, mutant)
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
    # Its own mistake, not another part's: the grader names no failing earlier part as the cause (it says
    # "part 4 uses your soft_attention_weights from part 2, which fails; fix part 2 first", and so does the grader
    # for a part of a group that reads a mutated one: see test_grouped_mutants_leave_the_other_parts_full_marks).
    assert "which fails; fix part" not in part["message"], part
    if mutant.sandbox_only:  # judged here only (test_learner_feedback names the others' mistakes in process)
        assert mutant.says in " ".join(part["message"].split()), part


@pytest.mark.parametrize("name", sorted({m.notebook for m in MUTANTS}))
def test_grouped_mutants_leave_the_other_parts_full_marks(graded, name):
    """The grouping's premise: in every group's notebook, each part that holds no mutant and reads nothing of a
    mutated part scores full marks, as in the solution (so a mutated part's verdict is its mutant's alone)."""
    links = linked_parts(name, MUTANTS)
    for file, group in graded["groups"].items():
        if group[0].notebook != name:
            continue
        mutated = {mutant.part for mutant in group}
        touched = mutated | {other for part in mutated for other in links[part]}
        for part in graded["results"][file]["parts"]:
            if part["name"] not in touched:
                assert part["score"] == part["max_score"], (file, [m.name for m in group], part)


#: The failure kind the grader's JSON gives a few representative mutants' parts (the cause apart from the message):
#: each is the kind of the first case the mistake fails, the same on every draw of the cases.
EXPECTED_KINDS = {
    "kv_hard_returns_keys": "known mistake",  # a shape, first: the keys' width, named as the mistake it is
    "scores_keys_by_queries": "shape",
    "hard_last_maximum": "mismatch",
    "kv_soft_naive_exp": "not finite",
    "kv_soft_over_queries": "property",
    "kv_soft_no_beta": "known mistake",
    "one_query_ignores_weights": "known mistake",
    "mha_key_used_as_value": "known mistake",
    "equivariance_inverse_permutation": "known mistake",
    "matrix_dot_T": "error raised",
    "project_no_dk_check": "expected error",
    "rms_calls_torch_rms_norm": "forbidden call",
}


@pytest.mark.parametrize(("name", "kind"), EXPECTED_KINDS.items())
def test_mutants_fail_for_the_reason_they_should(graded, name, kind):
    mutant = next(m for m in MUTANTS if m.name == name)
    part = parts(mutant_entry(graded, mutant))[mutant.part]
    assert part["kind"] == kind, part
    assert kind in {case["kind"] for case in part["cases"]} or not part["cases"]


def test_every_mutant_is_in_one_group_alone_in_its_part_and_unlinked(graded):
    placed = [mutant for group in graded["groups"].values() for mutant in group]
    assert sorted(m.name for m in placed) == sorted(m.name for m in MUTANTS)
    for group in graded["groups"].values():
        links = linked_parts(group[0].notebook, MUTANTS)
        parts_ = [mutant.part for mutant in group]
        assert len(set(parts_)) == len(parts_) and {m.notebook for m in group} == {group[0].notebook}
        assert not any(other in links[part] for part in parts_ for other in parts_), [m.name for m in group]


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
