"""Hostile and broken submissions: the grader gives no marks for them, and neither crashes nor hangs.

All cases are graded in one CLI call with a short --timeout. Each case starts from the ex02 solution
(5 parts, all correct) and breaks one or two things; the parts it does not touch must keep their marks,
including parts checked before the learner's code killed its process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from attention_course.grading.notebook_format import TAG_CHECK, cell_part, cell_tags
from tests.grading.mutants import SOLUTIONS, graded_cell

EX02 = SOLUTIONS / "ex02_hard_and_soft_attention.ipynb"
PARTS = ["hard_attention_weights", "soft_attention_weights", "attention_pooling", "self_attention_no_projections",
         "equivariance_gap"]
TIMEOUT = 6  # seconds per cell or part: long enough for honest code on a loaded machine


def replace(part: str, source: str) -> Callable[[nbformat.NotebookNode], None]:
    def edit(nb: nbformat.NotebookNode) -> None:
        graded_cell(nb, part).source = source
    return edit


def prepend(part: str, source: str) -> Callable[[nbformat.NotebookNode], None]:
    def edit(nb: nbformat.NotebookNode) -> None:
        cell = graded_cell(nb, part)
        cell.source = source + "\n" + cell.source
    return edit


def check_cell(nb: nbformat.NotebookNode, part: str) -> nbformat.NotebookNode:
    return next(c for c in nb.cells if TAG_CHECK in cell_tags(c) and cell_part(c) == part)


WRONG_SOFT = "def soft_attention_weights(scores, beta=1.0):\n    return torch.zeros_like(scores)"
CHEATS = """
import numpy as np
import torch
import attention_course.grading.compare as compare
import attention_course.grading.judge as judge
import attention_course.grading.wire as wire
import attention_course.grading.exercises.ex02 as ex02
from attention_course.grading.checker import Checker
torch.allclose = lambda *args, **kwargs: True
torch.Tensor.__eq__ = lambda self, other: torch.ones((), dtype=torch.bool)
np.allclose = lambda *args, **kwargs: True
np.testing.assert_allclose = lambda *args, **kwargs: None
for name in dir(compare):
    if name.endswith("_problem"):
        setattr(compare, name, lambda *args, **kwargs: None)
judge.judge_case = lambda part, case, outcome: judge.CaseVerdict(case.name, None)
ex02._verify_soft = lambda case, output: None
ex02.EXERCISE.parts[1].__dict__["verify"] = lambda case, output: None
Checker.check = lambda self, *args, **kwargs: print("PASS")
"""

TORCH_CHEATS = """
import numpy as np
import torch
torch.allclose = lambda *args, **kwargs: True
torch.equal = lambda *args, **kwargs: True
torch.Tensor.__eq__ = lambda self, other: torch.ones((), dtype=torch.bool)
np.allclose = lambda *args, **kwargs: True
np.testing.assert_allclose = lambda *args, **kwargs: None
"""


@dataclass
class Hostile:
    name: str
    edits: list[Callable[[nbformat.NotebookNode], None]]
    zero: dict[str, str]  # part -> a phrase its message must contain; every other part keeps full marks


def delete_check(part: str) -> Callable[[nbformat.NotebookNode], None]:
    def edit(nb: nbformat.NotebookNode) -> None:
        nb.cells.remove(check_cell(nb, part))
    return edit


def fake_check_output(nb: nbformat.NotebookNode) -> None:
    cell = check_cell(nb, "soft_attention_weights")
    cell.source = 'print("PASS  every case\\nPassed: all 8 cases, 2 of 2 points.")'
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="Passed: all 8 cases, 2 of 2 points.\n")]


def delete_graded(nb: nbformat.NotebookNode) -> None:
    nb.cells.remove(graded_cell(nb, "equivariance_gap"))


def strip_metadata(nb: nbformat.NotebookNode) -> None:
    nb.metadata = {"kernelspec": nb.metadata["kernelspec"]}
    for cell in nb.cells:
        cell.metadata = {}


HOSTILE = [
    Hostile("raises", [replace("hard_attention_weights",
                               "def hard_attention_weights(scores):\n    raise ValueError('no idea')")],
            {"hard_attention_weights": "ValueError: no idea"}),
    Hostile("infinite_loop_in_function", [replace("hard_attention_weights",
                                                  "def hard_attention_weights(scores):\n    while True:\n        pass")],
            {"hard_attention_weights": f"within {TIMEOUT} s"}),
    Hostile("infinite_loop_in_cell", [prepend("equivariance_gap", "while True:\n    pass")],
            {"equivariance_gap": f"within {TIMEOUT} s"}),
    Hostile("sys_exit_in_function", [replace("hard_attention_weights",
                                             "import sys\ndef hard_attention_weights(scores):\n    sys.exit(0)")],
            {"hard_attention_weights": "sys.exit"}),
    Hostile("sys_exit_in_cell", [prepend("equivariance_gap", "import sys\nsys.exit(1)")],
            {"equivariance_gap": "SystemExit"}),
    Hostile("os_exit_in_function", [prepend("equivariance_gap", "import os"),
                                    replace("hard_attention_weights",
                                            "import os\ndef hard_attention_weights(scores):\n    os._exit(0)")],
            {"hard_attention_weights": "ended the checking process"}),
    # Parts 1-3 are checked before part 4 kills its process; part 5 runs in a fresh one.
    Hostile("kills_its_process", [prepend("self_attention_no_projections",
                                          "import os, signal\n_kill = lambda: os.kill(os.getpid(), signal.SIGKILL)"),
                                  lambda nb: setattr(graded_cell(nb, "self_attention_no_projections"), "source",
                                                     graded_cell(nb, "self_attention_no_projections").source.replace(
                                                         "    ### BEGIN SOLUTION", "    _kill()\n    ### BEGIN SOLUTION"))],
            {"self_attention_no_projections": "SIGKILL"}),
    # Killing the process that started it (the sandbox's init, owned by another uid) is refused and disturbs
    # nothing: the code is right.
    Hostile("kills_its_parent", [prepend("attention_pooling", "import os, signal\ntry:\n"
                                         "    os.kill(os.getppid(), signal.SIGKILL)\nexcept OSError:\n    pass")],
            {}),
    Hostile("prints_10_megabytes", [prepend("hard_attention_weights", "print('x' * 10_000_000)")],
            {"hard_attention_weights": "printed more than"}),
    Hostile("monkeypatches_torch_and_numpy", [replace("soft_attention_weights", TORCH_CHEATS + WRONG_SOFT)],
            {"soft_attention_weights": "failed", "self_attention_no_projections": "failed"}),
    # Importing the grader's own modules breaks the library rule: no marks, whatever the patches would do.
    Hostile("monkeypatches_torch_numpy_and_the_checker", [replace("soft_attention_weights", CHEATS + WRONG_SOFT)],
            {"soft_attention_weights": "the grader's own code", "self_attention_no_projections": "failed"}),
    Hostile("fakes_its_check_cell", [replace("soft_attention_weights", WRONG_SOFT), fake_check_output],
            {"soft_attention_weights": "check cell was edited or deleted", "self_attention_no_projections": "failed"}),
    Hostile("deletes_check_cell_with_wrong_code", [replace("soft_attention_weights", WRONG_SOFT),
                                                   delete_check("soft_attention_weights")],
            {"soft_attention_weights": "check cell was edited or deleted", "self_attention_no_projections": "failed"}),
    # Correct code does not save a part whose check cell is gone (COURSE.md: editing a check earns nothing).
    Hostile("deletes_check_cell_with_right_code", [delete_check("attention_pooling")],
            {"attention_pooling": "check cell was edited or deleted"}),
    Hostile("edits_check_cell_with_right_code", [lambda nb: setattr(check_cell(nb, "attention_pooling"), "source",
                                                                    "print('checked')")],
            {"attention_pooling": "check cell was edited or deleted"}),
    Hostile("renames_the_function", [lambda nb: setattr(graded_cell(nb, "hard_attention_weights"), "source",
                                                        graded_cell(nb, "hard_attention_weights").source.replace(
                                                            "def hard_attention_weights(", "def hard_attention(")) ],
            {"hard_attention_weights": "renamed"}),
    Hostile("deletes_a_graded_cell", [delete_graded], {"equivariance_gap": "no graded cell"}),
    Hostile("syntax_error", [prepend("hard_attention_weights", "def broken(:")],
            {"hard_attention_weights": "SyntaxError"}),
    # A forked child keeps running Python (with the grader's guard); starting a program is refused at run time.
    Hostile("leaves_a_thread_and_a_child_process_running", [prepend("equivariance_gap", (
        "import os, threading, time\n"
        "threading.Thread(target=lambda: time.sleep(10**6)).start()\n"
        "if os.fork() == 0:\n"
        "    time.sleep(10**6)\n"
        "    os._exit(0)"))], {}),
    Hostile("starts_another_program", [prepend("equivariance_gap", (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(10**6)'])"))],
        {"equivariance_gap": "may not start other programs"}),
    Hostile("editor_dropped_all_metadata", [strip_metadata], {}),
]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    for case in HOSTILE:
        nb = nbformat.read(EX02, as_version=4)
        for edit in case.edits:
            edit(nb)
        # File names without "ex02": the exercise must come from the notebook's metadata...
        nbformat.write(nb, folder / f"{case.name}.ipynb")
    # ... except for the notebook that lost its metadata, which is recognised by its file name.
    (folder / "editor_dropped_all_metadata.ipynb").rename(folder / "ex02_editor_dropped_all_metadata.ipynb")
    (folder / "notes.txt").write_text("not a notebook")
    (folder / "malformed.ipynb").write_text('{"cells": [ this is not json')
    (folder / "valid_json_not_a_notebook.ipynb").write_text('{"hello": "world"}')
    (folder / ".ipynb_checkpoints").mkdir()
    (folder / ".ipynb_checkpoints" / "raises-checkpoint.ipynb").write_text(EX02.read_text())
    out = folder.parent / f"{folder.name}-grades.json"
    command = [sys.executable, "-m", "attention_course.grading", str(folder), str(folder / "notes.txt"),
               "--json", str(out), "--timeout", str(TIMEOUT), "--jobs", "2"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    results = {Path(entry["path"]).name: entry for entry in json.loads(out.read_text())["notebooks"]}
    return {"results": results, "stdout": run.stdout, "stderr": run.stderr}


@pytest.mark.parametrize("case", HOSTILE, ids=[c.name for c in HOSTILE])
def test_hostile_part_earns_nothing_and_the_others_keep_their_marks(graded, case):
    name = "ex02_editor_dropped_all_metadata.ipynb" if case.name == "editor_dropped_all_metadata" else case.name + ".ipynb"
    entry = graded["results"][name]
    parts = {part["name"]: part for part in entry["parts"]}
    assert list(parts) == PARTS
    for part, phrase in case.zero.items():
        assert parts[part]["score"] == 0, parts[part]
        assert phrase in parts[part]["message"], parts[part]["message"]
        assert "Traceback" not in parts[part]["message"]
    for part in [p for p in PARTS if p not in case.zero]:
        assert parts[part]["score"] == parts[part]["max_score"], (part, parts[part]["message"])


def test_metadata_fallback_is_reported(graded):
    entry = graded["results"]["ex02_editor_dropped_all_metadata.ipynb"]
    assert "matched by function name" in entry["message"]


@pytest.mark.parametrize("name, phrase", [
    ("notes.txt", "not a notebook"),
    ("malformed.ipynb", "could not read the notebook"),
    ("valid_json_not_a_notebook.ipynb", "could not read the notebook"),
])
def test_files_that_are_not_notebooks_get_a_clear_message(graded, name, phrase):
    entry = graded["results"][name]
    assert entry["score"] == 0 and phrase in entry["message"] and "Traceback" not in entry["message"]


def test_checkpoints_are_skipped_and_nothing_crashed(graded):
    assert "raises-checkpoint.ipynb" not in graded["results"]
    assert "Traceback" not in graded["stdout"] + graded["stderr"]


def test_output_limit_blames_the_cell_that_printed_even_when_the_grader_looks_late(tmp_path, monkeypatch):
    """The printing cell finishes long before the grader's next look at the log: the blame must not move on.

    With a one-second poll the worker has run every later cell and part by then; without the worker's own
    check before each step, the printing part kept its marks and a later one lost them (a CI failure).
    """
    from attention_course.grading import sandbox
    from attention_course.grading.grader import grade_notebook

    monkeypatch.setattr(sandbox, "_POLL", 1.0)
    nb = nbformat.read(EX02, as_version=4)
    prepend("hard_attention_weights", "print('x' * 3_000_000)")(nb)
    path = tmp_path / "prints_late.ipynb"
    nbformat.write(nb, path)
    result = grade_notebook(path, timeout=TIMEOUT, seed=0)
    scores = {verdict.part: (verdict.score, verdict.max_score, verdict.message) for verdict in result.parts}
    assert scores["hard_attention_weights"][0] == 0
    assert "printed more than" in scores["hard_attention_weights"][2]
    for part in [p for p in PARTS if p != "hard_attention_weights"]:
        score, max_score, message = scores[part]
        assert score == max_score, (part, message)


def test_a_worker_that_cannot_start_fails_every_part_with_the_reason(tmp_path, monkeypatch):
    """No learner code runs before the worker says it is ready: a worker that never does is replaced once,
    then every part fails naming the start-up, and nothing is left running."""
    from attention_course.grading import launcher
    from attention_course.grading.grader import grade_notebook

    launcher.close_pools()
    monkeypatch.setattr(launcher, "bootstrap_source", lambda *args: "print('torch is broken here'); raise SystemExit(5)")
    path = tmp_path / "ex02.ipynb"
    nbformat.write(nbformat.read(EX02, as_version=4), path)
    result = grade_notebook(path, timeout=TIMEOUT, seed=0)
    assert result.score == 0
    for verdict in result.parts:
        assert "could not start" in verdict.message and "torch is broken here" in verdict.message, verdict.message
    assert not launcher._live


def test_a_course_installed_under_tmp_is_visible_in_the_sandbox(monkeypatch):
    """A fresh clone in a temporary folder (its venv and package under /tmp) must not be hidden by the
    sandbox's private /tmp: the read-only binds go on top of it."""
    import tempfile

    from attention_course.grading import isolation

    if isolation.bwrap_path() is None:
        pytest.skip("bubblewrap is not installed (make grader-deps installs it)")
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        installed = Path(folder) / "course"
        installed.mkdir()
        (installed / "marker.txt").write_text("visible")
        real = isolation._read_only_paths()
        monkeypatch.setattr(isolation, "_read_only_paths", lambda: [*real, str(installed)])
        command = isolation.sandbox_command(["/bin/cat", str(installed / "marker.txt")], uid=None)
        assert command.index("--tmpfs") < command.index(str(installed)), "the private /tmp would hide the bind"
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout == "visible", result.stderr


def test_a_dead_graders_sandbox_folders_are_swept_and_live_ones_kept(tmp_path):
    """A notebook kernel that Jupyter shuts down never runs its atexit: its sandbox folders stay in /tmp
    until the next grader or check sweeps them."""
    import os
    import time

    from attention_course.grading.launcher import sweep_leftovers

    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
    dead_pid = int(finished.stdout)
    old = time.time() - 3600
    folders = {name: tmp_path / f"attention-course-grading-{pid}-{name}"
               for name, pid in (("dead", dead_pid), ("live", os.getpid()), ("fresh", dead_pid))}
    for name, folder in folders.items():
        folder.mkdir()
        (folder / "output.log").write_text("")
        if name != "fresh":
            os.utime(folder, (old, old))
    unrelated = tmp_path / "attention-course-grading-notes"
    unrelated.mkdir()
    os.utime(unrelated, (old, old))
    assert sweep_leftovers(tmp_path) == [folders["dead"]]
    assert not folders["dead"].exists()
    assert folders["live"].exists() and folders["fresh"].exists() and unrelated.exists()


# --- issue 42: no user namespace inside, as root too ------------------------------------------------------
USER_NAMESPACE_CELL = """
import ctypes, os, subprocess
def hard_attention_weights(scores):
    libc = ctypes.CDLL(None, use_errno=True)
    direct = libc.unshare(0x10000000)  # CLONE_NEWUSER
    forked = subprocess.run(["unshare", "-U", "true"], capture_output=True).returncode
    return torch.tensor([float(direct), float(forked), float(os.getuid())])
"""


def _user_namespace_attempt() -> list[float]:
    """What the cell above gets in a real worker sandbox, with the run-time guard left out (``allowed=None``):
    the issue's learner switched the guard off by writing memory, so the sandbox must hold without it."""
    import torch

    from attention_course.grading.exercises import get_exercise
    from attention_course.grading.launcher import close_pools
    from attention_course.grading.sandbox import run_parts

    close_pools()  # no warm sandbox started with other settings
    exercise = get_exercise("ex02")
    part = exercise.part("hard_attention_weights")
    result = run_parts("ex02", exercise.preamble, [(0, part.name, USER_NAMESPACE_CELL)],
                       [(part.name, part.make_cases(torch.Generator())[:1])], timeout=60, allowed=None)
    close_pools()
    assert part.name in result.outcomes, (result.failures, result.cell_errors)
    outcome = result.outcomes[part.name][0]
    assert outcome["status"] == "ok", outcome
    return outcome["value"].tolist()


def test_no_user_namespace_inside_the_sandbox(monkeypatch):
    """Issue 42: as root the sandbox had no user namespace of its own and no --disable-userns, so learner code
    could make one (root and every capability inside it). A seccomp filter now refuses unshare and clone
    with CLONE_NEWUSER (and setns, clone3, other ABIs) in every sandbox. The control, without the filter,
    shows what the test would see on the old code as root."""
    from attention_course.grading import isolation, launcher

    if isolation.bwrap_path() is None:
        pytest.skip("bubblewrap is not installed (make grader-deps installs it)")
    direct, forked, uid = _user_namespace_attempt()
    assert direct == -1 and forked != 0, (direct, forked)
    assert uid != 0  # the worker runs as a uid of its own (root mode) or as the instructor (user namespace)
    if os.geteuid() == 0 and isolation.sandbox_mode() == "root":
        monkeypatch.setattr(launcher, "seccomp_fd", lambda: None)
        direct, _, _ = _user_namespace_attempt()
        assert direct == 0, "the control: without the filter, root's sandbox lets unshare(CLONE_NEWUSER) through"


def test_the_seccomp_program_is_well_formed():
    """Classic BPF: 8 bytes per instruction, every jump inside the program, every path ends in a return."""
    import struct

    from attention_course.grading.isolation import userns_filter

    program = userns_filter()
    if program is None:
        pytest.skip("no filter for this architecture")
    instructions = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    for index, (code, true, false, _) in enumerate(instructions):
        if code & 0x07 == 0x05:  # a jump
            assert index + 1 + max(true, false) < len(instructions)
    assert instructions[-1][0] == 0x06
