"""Verdicts fixed by construction (issue 43): every known mistake and simulated learner gets the same score on
every draw of the cases, and no known mistake earns credit from a case that cannot tell it apart.

Judged in this process (the part's ``make_cases``, ``run`` and ``verify``, as the notebook check and the grader
call them), so twenty draws of every mutant stay cheap; the grader's own runs are in test_grader_scores.py and
test_learners.py. ex16 and ex17 are left to their own tests.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import nbformat
import pytest
import torch

from attention_course.grading import get_exercise
from attention_course.grading.judge import PartVerdict, judge_part
from attention_course.grading.notebook_format import TAG_GRADED, cell_tags, notebook_exercise
from attention_course.grading.wire import outcome_of_call
from tests.grading.learners import LEARNERS, build
from tests.grading.mutants import IN_PROCESS, apply

SEEDS = range(20)
#: Exercises other sessions own (issue 43 leaves them to their own tests).
ELSEWHERE = ("ex16", "ex17")
OURS = [m for m in IN_PROCESS if not m.notebook.startswith(ELSEWHERE)]


def _namespace(nb: nbformat.NotebookNode, extra: tuple[str, ...] = ()) -> tuple[object, dict]:
    """The exercise and the names a notebook's graded cells (and ``extra`` cells, run first) define."""
    exercise = get_exercise(notebook_exercise(nb))
    namespace: dict = {}
    exec(exercise.preamble, namespace)
    for source in extra:
        exec(source, namespace)
    for cell in nb.cells:
        if cell.cell_type == "code" and TAG_GRADED in cell_tags(cell):
            exec(cell.source, namespace)
    return exercise, namespace


@functools.cache
def drawn_cases(exercise_id: str, part_name: str, seed: int) -> tuple:
    """The cases of ``part_name`` drawn from ``seed``, made once per test process: every mutant and simulated
    learner of a part is judged on the same twenty draws (a draw depends on its seed alone), and some parts'
    cases are dear to make (ex10's greedy_decode: about a second a draw). Never handed out: see
    :func:`judge_in_process`."""
    return tuple(get_exercise(exercise_id).part(part_name).make_cases(torch.Generator().manual_seed(seed)))


def judge_in_process(exercise, namespace: dict, part_name: str, seed: int) -> PartVerdict:
    """The verdict the check gives ``namespace``'s function for ``part_name`` on the cases of ``seed``
    (a deep copy of the drawn cases: what one function's run does to its cases reaches no other's)."""
    part = exercise.part(part_name)
    cases = copy.deepcopy(list(drawn_cases(exercise.id, part_name, seed)))
    outcomes = [outcome_of_call(functools.partial(part.run, namespace[part.function], case)) for case in cases]
    return dataclasses.replace(judge_part(part, cases, outcomes), all_or_nothing=part.all_or_nothing)


@functools.cache
def mutant_namespace(name: str) -> tuple[object, dict]:
    """The exercise and the names that mutant ``name``'s graded cells define (run once)."""
    torch.manual_seed(0)
    return _namespace(apply(next(m for m in OURS if m.name == name)))


@functools.cache
def mutant_verdict(name: str, seed: int) -> PartVerdict:
    """The verdict of mutant ``name`` on the draw of ``seed`` (PyTorch's global generator seeded too, so that
    the verdict does not depend on which draws this process judged before)."""
    exercise, namespace = mutant_namespace(name)
    torch.manual_seed(seed)
    return judge_in_process(exercise, namespace, next(m for m in OURS if m.name == name).part, seed)


def mutant_verdicts(name: str) -> tuple[PartVerdict, ...]:
    return tuple(mutant_verdict(name, seed) for seed in SEEDS)


@pytest.mark.parametrize("mutant", OURS, ids=[m.name for m in OURS])
def test_a_known_mistake_gets_the_same_score_on_every_draw(mutant):
    verdicts = mutant_verdicts(mutant.name)
    scores = sorted({verdict.score for verdict in verdicts})
    assert len(scores) == 1, f"{mutant.name} scores {scores} over {len(SEEDS)} draws"
    assert scores[0] < verdicts[0].max_score, f"{mutant.name} is not caught"
    if mutant.zero:
        assert scores == [0], f"{mutant.name} must earn nothing"
    # and for the same reasons: each case that earns credit passes on every draw or on none
    outcomes = {tuple(case.passed for case in verdict.cases if case.credit) for verdict in verdicts}
    assert len(outcomes) == 1, f"{mutant.name}: which cases pass depends on the draw: {outcomes}"


def _degenerate_cases() -> list[tuple[str, str, str]]:
    """(notebook, part, case) for every case marked degenerate (credit=False) in the parts of OURS."""
    found = []
    for notebook, part_name in dict.fromkeys((m.notebook, m.part) for m in OURS):
        exercise = get_exercise(notebook_exercise(apply(next(m for m in OURS if m.notebook == notebook))))
        for case in exercise.part(part_name).make_cases(torch.Generator().manual_seed(0)):
            if not case.credit:
                found.append((notebook, part_name, case.name))
    return found


def test_every_degenerate_case_hides_a_known_mistake():
    """The degenerate-case rule (a case that a known mistake passes because its inputs hide it earns nothing) is
    applied with care: each case marked degenerate is passed by at least one known mistake of its part (so the
    mark is not there to take marks away for nothing). The mutants marked ``zero`` (right only on such cases)
    must score 0 on every draw: test_a_known_mistake_gets_the_same_score_on_every_draw checks that."""
    unused = []
    for notebook, part_name, case_name in _degenerate_cases():
        mutants = [m.name for m in OURS if (m.notebook, m.part) == (notebook, part_name)]
        passed_by = [name for name in mutants
                     if any(case.passed for case in mutant_verdict(name, 0).cases if case.name == case_name)]
        if not passed_by:
            unused.append(f"{part_name}: {case_name}")
    assert not unused, f"degenerate cases no known mistake passes: {unused}"


# Simulated learners whose notebook the check can run in this process (the infinite loop needs the sandbox).
IN_PROCESS = [learner for learner in LEARNERS
              if learner.time_limit is None and not learner.notebook.startswith(ELSEWHERE)]


@pytest.mark.parametrize("learner", IN_PROCESS, ids=[learner.name for learner in IN_PROCESS])
def test_a_simulated_learner_gets_the_same_score_on_every_draw(learner, tmp_path):
    nb = nbformat.read(build(learner, tmp_path), as_version=4)
    exercise, namespace = _namespace(nb, tuple(learner.before.values()))
    for part in exercise.parts:
        scores = sorted({judge_in_process(exercise, namespace, part.name, seed).score for seed in SEEDS})
        assert len(scores) == 1, f"{learner.name}: {part.name} scores {scores} over {len(SEEDS)} draws"
