"""The library rule at the filesystem (issue 42): each sandbox sees a view of the course package.

One grader run (the documented command) grades an honest ex14 solution next to learners who switch the
run-time guard off by writing their own process's memory (NumPy's ``__array_interface__`` on an address a
stack summary shows; the attack that earned ex14 3/3 with the library's ``apply_rotary`` before views),
and probes that report what the sandbox holds. The views themselves are checked without a sandbox: for
every exercise and allowance group, the modules a job's view holds (the worker's, the exercise's sandbox
side, what its cases need, its allowance) leave out the references of the parts.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

from attention_course.grading import package_view
from attention_course.grading.exercises import exercise_ids, get_exercise
from attention_course.grading.isolation import bwrap_path
from attention_course.grading.library_rules import exercise_allowed
from attention_course.grading.sandbox import _allowance_groups, public_case
from attention_course.grading.worker import Job
from tests.grading.mutants import graded_cell

ROOT = Path(__file__).resolve().parents[2]
EX14 = "ex14_positions_for_long_contexts.ipynb"
EX10 = "ex10_decoder_and_transformer.ipynb"

# Switch the run-time guard off through memory, then take the library's answer (issue 42's attack).
MEMORY_ATTACK = '''
import importlib, re, sys, traceback

import numpy as np


def _memory(address, count):
    class Raw:
        pass
    raw = Raw()
    raw.__array_interface__ = {"data": (address, False), "shape": (count,), "typestr": "<u8", "version": 3}
    return np.asarray(raw)


def _switch_off_the_guard():
    """Write 1 into every one-item list held by a closure of a function a stack summary shows (the guard's
    "trusted window" counter was one)."""
    summary = traceback.StackSummary.extract(traceback.walk_stack(None), capture_locals=True)
    shown = " ".join(str(value) for frame in summary for value in (frame.locals or {}).values())
    addresses = {int(found, 16) for found in re.findall(r"<function [\\w.<>]+ at (0x[0-9a-f]+)>", shown)}
    def outer():
        state = [0]
        def inner():
            return state
        return inner
    probe = outer()
    words = _memory(id(probe), 16)
    closure_at = [i for i in range(16) if int(words[i]) == id(probe.__closure__)][0]
    for address in addresses:
        closure = int(_memory(address, 16)[closure_at])
        size = int(_memory(closure, 3)[2]) if closure else 0
        for cell in _memory(closure + 24, size) if 0 < size < 8 else ():
            content = int(_memory(int(cell), 3)[2])
            if content and int(_memory(content, 2)[1]) == id(list) and int(_memory(content, 3)[2]) == 1:
                _memory(int(_memory(content, 4)[3]), 1)[0] = id(1)


def _library(module, name):
    _switch_off_the_guard()
    found = getattr(importlib.import_module("attention" + "_course." + module), name)
    for key in [key for key in sys.modules if key.startswith("attention" + "_course.")]:
        del sys.modules[key]  # the worker checks sys.modules after each part
    return found
'''

ROTATE_WITH_THE_LIBRARY = MEMORY_ATTACK + '''

def rotate_pairs(x, positions, base=10000.0):
    return _library("rotary", "apply_rotary")(x, positions, base=base)
'''

# The same attack against a module the view holds (the grader's wire format): only the guard is in the way.
GUARD_STILL_HOLDS = MEMORY_ATTACK + '''

def rotate_pairs(x, positions, base=10000.0):
    _library("grading.wire", "encode")
    raise RuntimeError("LEAK: the guard was switched off")
'''

# What the sandbox holds: the package's folder and whether the reference module can be found.
PROBE = '''
import importlib.util, os, sys


def {name}(*args, **kwargs):
    folder = sys.modules["attention" + "_course"].__path__[0]
    listing = sorted(os.listdir(folder))
    spec = importlib.util.find_spec("attention" + "_course.{hidden}")
    raise RuntimeError(f"VIEW found={{spec is not None}} files={{listing}}")
'''


def _notebook(source: Path, replacements: dict[str, str], target: Path) -> None:
    nb = nbformat.read(source, as_version=4)
    for part, code in replacements.items():
        graded_cell(nb, part).source = code
    nbformat.write(nb, target)


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    if bwrap_path() is None:
        pytest.skip("bubblewrap (make grader-deps) is not installed")
    base = tmp_path_factory.mktemp("package_view")
    sub = base / "submissions"
    sub.mkdir()
    _notebook(ROOT / "exercises" / "solutions" / EX14, {}, sub / "honest_ex14.ipynb")
    learner14, learner10 = ROOT / "exercises" / EX14, ROOT / "exercises" / EX10
    _notebook(learner14, {"rotate_pairs": ROTATE_WITH_THE_LIBRARY}, sub / "attack_memory_ex14.ipynb")
    _notebook(learner14, {"rotate_pairs": GUARD_STILL_HOLDS}, sub / "attack_guard_ex14.ipynb")
    _notebook(learner14, {"rotate_pairs": PROBE.format(name="rotate_pairs", hidden="alibi")},
              sub / "probe_ex14.ipynb")
    ex10 = get_exercise("ex10")
    _notebook(learner10, {part: PROBE.format(name=ex10.part(part).function, hidden="masks")
                          for part in ("shift_target", "decoder_layer_forward")}, sub / "probe_ex10.ipynb")
    command = [sys.executable, "-m", "attention_course.grading", str(sub), "--json", str(base / "grades.json"),
               "--timeout", "10", "--seed", "0"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    notebooks = json.loads((base / "grades.json").read_text())["notebooks"]
    return {Path(entry["path"]).name: entry for entry in notebooks}


def _message(entry: dict, part: str) -> str:
    return next(p["message"] for p in entry["parts"] if p["name"] == part)


def test_an_honest_learner_keeps_full_marks(graded):
    entry = graded["honest_ex14.ipynb"]
    assert entry["score"] == entry["max_score"] > 0, entry


def test_switching_the_guard_off_through_memory_earns_nothing(graded):
    """Before views: 3/3 (the library's apply_rotary imported once the guard's counter was overwritten)."""
    entry = graded["attack_memory_ex14.ipynb"]
    assert entry["score"] == 0, entry
    assert "No module named 'attention_course.rotary'" in _message(entry, "rotate_pairs"), entry


def test_the_guard_keeps_no_state_that_memory_writes_can_switch(graded):
    """The same writes leave the run-time guard standing (it holds no counter any more): importing a module
    that is in the view is still refused."""
    message = _message(graded["attack_guard_ex14.ipynb"], "rotate_pairs")
    assert "LEAK" not in message and "graded code may not" in message, message


def test_the_sandbox_holds_only_the_view(graded):
    message = _message(graded["probe_ex14.ipynb"], "rotate_pairs")
    assert "VIEW found=False files=['__init__.py', 'grading']" in message, message


def test_each_allowance_group_sees_its_own_view(graded):
    """ex10's shift_target may use nothing of the library: masks.py is absent from its sandbox; the decoder
    layer may call ac.causal_mask: its sandbox (another one) has masks.py."""
    entry = graded["probe_ex10.ipynb"]
    without, with_masks = _message(entry, "shift_target"), _message(entry, "decoder_layer_forward")
    assert "VIEW found=False" in without and "'masks.py'" not in without, without
    assert "VIEW found=True" in with_masks and "'masks.py'" in with_masks, with_masks


# --- the views, without a sandbox ---------------------------------------------------------------------
def _views() -> dict[tuple[str, frozenset[str]], frozenset[str]]:
    """(exercise, allowance) -> the modules of its job's view, for the jobs the grader sends (seed 0)."""
    views = {}
    for exercise_id in exercise_ids():
        exercise = get_exercise(exercise_id)
        generator = torch.Generator().manual_seed(0)
        part_cases = [(part.name, part.make_cases(generator)) for part in exercise.parts]
        for allowance, group in _allowance_groups(exercise_id, part_cases, exercise_allowed(exercise_id)):
            job = Job(exercise_id, "", [], [(part, [public_case(c) for c in cases]) for part, cases in group],
                      allowed=allowance, library=package_view.library_sources(allowance))
            modules = package_view.view_modules(exercise_id, allowance,
                                                package_view.pickle_modules(pickle.dumps(job)))
            views[exercise_id, allowance] = modules
    return views


def test_no_view_holds_a_reference_its_parts_may_not_use():
    """The modules each exercise checks learners against stay out of its sandboxes (ex11's tiled.py too: its
    memory measurement warms up with a loop of its own, not the library's)."""
    references = {"ex03": "additive", "ex06": "multihead", "ex07": "positional", "ex13": "sampling",
                  "ex14": "alibi", "ex16": "interpretability", "ex10": "decoding", "ex11": "tiled"}
    views = _views()
    for (exercise_id, allowance), modules in views.items():
        other_exercises = {m for m in modules if m.startswith("attention_course.grading.exercises.")
                           and m.rsplit(".", 1)[1] not in (exercise_id, "ex08")}  # bug_hunt reuses ex08's runner
        assert not other_exercises, (exercise_id, other_exercises)
        assert "attention_course.grading.grader" not in modules and "attention_course.grading.sandbox" not in modules
        hidden = references.get(exercise_id)
        if hidden:
            assert f"attention_course.{hidden}" not in modules, (exercise_id, sorted(modules))
        assert "attention_course.rotary" not in modules or allowance, (exercise_id, sorted(modules))
    encoder_layer = frozenset({"MultiHeadAttention", "PositionwiseFeedForward", "LayerNorm", "Dropout"})
    assert "attention_course.multihead" in views["ex09", encoder_layer]
    assert "attention_course.layers" not in views["ex09", encoder_layer]  # its EncoderLayer is the answer
    assert "attention_course.masks" not in views["ex10", frozenset()]
    assert "attention_course.masks" in views["ex10", frozenset({"causal_mask", "padding_mask", "combine_masks"})]


def test_a_view_is_filled_for_one_job_at_a_time(tmp_path):
    """A zygote's view serves one job after another: filling it for the next job removes the last job's
    modules."""
    view = package_view.new_view(tmp_path)
    start = {str(p.relative_to(view)) for p in view.rglob("*") if p.is_file()}
    assert "__init__.py" in start and "grading/worker.py" in start and "masks.py" not in start
    assert "attention" in (view / "__init__.py").read_text() and "import" not in (view / "__init__.py").read_text()
    package_view.fill_view(view, package_view.view_modules("ex10", frozenset({"causal_mask"})))
    assert (view / "masks.py").is_file() and (view / "grading" / "exercises" / "ex10.toml").is_file()
    package_view.fill_view(view, package_view.view_modules("ex14", frozenset()))
    now = {str(p.relative_to(view)) for p in view.rglob("*") if p.is_file()}
    assert "masks.py" not in now and "grading/exercises/ex10.py" not in now and "grading/exercises/ex14.py" in now
    assert not os.access(view / "grading" / "worker.py", os.W_OK) or os.geteuid() == 0
