"""One verdict: simulated learners' notebooks, executed in a real kernel and graded by the grader.

For every notebook in :data:`tests.grading.learners.LEARNERS` (correct-but-unusual answers for every
exercise, helpers and imports in extra cells, a library call the exercise allows, edited check cells,
inputs changed in place, a part that fails because an earlier one does, an infinite loop), the score
each check shows in the notebook must equal the grader's, part by part, and both must be what the
learner deserves. The notebooks run two at a time; the grader grades them all in one run.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

from tests.grading.learners import LEARNERS, ROOT, SEED, build

nbclient = pytest.importorskip("nbclient")

_HEADER = re.compile(r"^(\w+) part \d+ of \d+: (\w+) \((\d+) points?\)$")
_RESULT = re.compile(r"^  (?:Passed: all \d+ cases|Not yet: \d+ of \d+ cases passed), ([0-9.]+) of (\d+) points\.$")


def _outputs(nb: nbformat.NotebookNode) -> str:
    texts = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            texts.append(output.get("text", "") or "\n".join(output.get("traceback", [])))
    return "\n".join(texts)


def shown_scores(text: str) -> dict[str, float]:
    """part -> the score its last check in the notebook showed (0 for "not attempted" or a failed run)."""
    scores: dict[str, float] = {}
    current = None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            current = header.group(2)
            scores[current] = 0.0
        result = _RESULT.match(line)
        if result and current is not None:
            scores[current] = float(result.group(1))
    return scores


def _execute(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3", allow_errors=True,
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    return _outputs(nb)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("class")
    paths = {learner.name: build(learner, folder) for learner in LEARNERS}
    with ThreadPoolExecutor(max_workers=2) as pool:
        shown = dict(zip(paths, pool.map(_execute, paths.values())))
    out = folder.parent / f"{folder.name}-grades.json"
    # --timeout is the grader's wall-clock limit per step: 30 s is far beyond what a correct part needs (under a
    # second of CPU) even with every core busy, so only the infinite loop meets it, whatever the load.
    command = [sys.executable, "-m", "attention_course.grading", str(folder), "--json", str(out), "--seed",
               str(SEED), "--timeout", "30", "--jobs", "2", "--quiet"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=3600)  # a hang guard, not a budget
    assert run.returncode == 0, run.stderr
    graded = {Path(entry["path"]).stem: entry for entry in json.loads(out.read_text())["notebooks"]}
    return {"shown": shown, "graded": graded}


def test_every_exercise_has_a_simulated_learner():
    solutions = {path.stem for path in (ROOT / "exercises" / "solutions").glob("*.ipynb")}
    missing = sorted(solutions - {learner.notebook for learner in LEARNERS})
    assert not missing, f"add a simulated learner to tests/grading/learners.py for {missing}"


@pytest.mark.parametrize("learner", LEARNERS, ids=[learner.name for learner in LEARNERS])
def test_notebook_shows_the_grade_the_grader_gives(runs, learner):
    text, entry = runs["shown"][learner.name], runs["graded"][learner.name]
    assert "Traceback" not in text, text[-3000:]
    shown = shown_scores(text)
    graded = {part["name"]: part for part in entry["parts"]}
    assert set(shown) == set(graded), (shown, graded)
    for name, part in graded.items():
        assert shown[name] == pytest.approx(part["score"]), (name, text, part)
        expected = learner.expect.get(name, "full")
        if expected == "full":
            assert part["score"] == part["max_score"], part
        elif expected == "zero":
            assert part["score"] == 0, part
        else:
            assert 0 <= part["score"] < part["max_score"], part
    total = re.findall(r"Progress: \d+ of \d+ parts passed, ([0-9.]+) of \d+ points", text)[-1]
    assert float(total) == pytest.approx(entry["score"])
    for words in learner.shown:
        assert words in " ".join(text.split()), (words, text)
    # The warning about another cell's names comes with the part that uses them, not with every check.
    warned = text.count("defined in a cell the grader does not run")
    assert warned == sum("defined in a cell the grader does not run" in words for words in learner.shown), text
