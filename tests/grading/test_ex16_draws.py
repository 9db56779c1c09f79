"""ex16: a known-wrong answer gets the same score on every draw, and the message names its mistake.

The notebook's check and the instructor's grader draw their own random cases; a verdict that depended on the
draw would make them disagree (issue 43). Every ex16 case is built so that each known mistake's verdict on it is
fixed (sequences with unequal counts for the per-sequence average, scales that show, patches that leave some
positions out, degenerate cases marked ``credit=False``); here each ex16 mutant of :mod:`tests.grading.mutants`
is checked in-process on 20 seeds.
"""

from __future__ import annotations

import io
import re
from contextlib import redirect_stdout

import pytest

from attention_course.grading import get_exercise
from attention_course.grading.checker import Checker
from attention_course.grading.notebook_format import TAG_GRADED, cell_tags
from tests.grading.mutants import EX16, MUTANTS, apply

SEEDS = range(20)
EX16_MUTANTS = [mutant for mutant in MUTANTS if mutant.notebook == EX16]
# What the message must say for the mistakes issues 38 and 43 named.
NAMED = {
    "repeat_seeds_global_generator": "global random generator",
    "induction_averaged_per_sequence": "averaged each sequence's queries first",
    "ablation_unscaled_scores": "not scaled",
    "dla_skips_norm_scale": "skipped the final norm's scale",
    "patch_overwrites_every_position": "at every position",
    "copying_score_from_w_q": "you used W_Q",
}
POINTS = re.compile(r"(\d+(?:\.\d+)?) of (\d+) points?\.")


def _function(mutant):
    exercise = get_exercise("ex16")
    namespace: dict = {}
    exec(exercise.preamble, namespace)
    for cell in apply(mutant).cells:
        if TAG_GRADED in cell_tags(cell):
            exec(cell.source, namespace)
    return exercise, namespace[exercise.part(mutant.part).function]


def test_every_named_mistake_has_a_mutant():
    assert set(NAMED) <= {mutant.name for mutant in EX16_MUTANTS}


@pytest.mark.parametrize("mutant", EX16_MUTANTS, ids=[m.name for m in EX16_MUTANTS])
def test_mutant_scores_the_same_on_every_draw(mutant):
    exercise, function = _function(mutant)
    scores, reports = set(), []
    for seed in SEEDS:
        checker = Checker(exercise, seed=seed, isolated=False)
        text = io.StringIO()
        with redirect_stdout(text):
            checker.check(mutant.part, function)
        report = text.getvalue()
        part_lines = [line for line in report.splitlines() if not line.startswith("Progress")]
        found = [POINTS.search(line) for line in part_lines]
        score = next(float(m[1]) for m in found if m)
        scores.add(score)
        reports.append(report)
        assert not checker.passed(mutant.part), f"{mutant.name} passed on seed {seed}"
        if mutant.name in NAMED:
            assert NAMED[mutant.name] in " ".join(report.split()), (
                f"seed {seed}: the message does not name the mistake:\n{report}")
    assert len(scores) == 1, f"{mutant.name} scored {sorted(scores)} over {len(SEEDS)} seeds"
    if mutant.zero:
        assert scores == {0.0}, f"{mutant.name} earned {scores} (it must earn nothing):\n{reports[0]}"
