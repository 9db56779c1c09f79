"""ex17: a known-wrong answer gets the same score on every draw (issue 43), and each new part catches its mistakes.

The notebook's check and the instructor's grader draw their own random cases; a verdict that depended on the
draw would make them disagree. ex17's cases are built so that it cannot: block tables never map an entry to
itself, draft tokens and uniforms are chosen against the acceptance ratio, the scheduler's free blocks are
counted against the blocks a step needs, and paged attention's largest score and its unmasked tail are planted.
Here every ex17 mutant of :mod:`tests.grading.mutants` is judged in-process on 20 seeds.
"""

from __future__ import annotations

import pytest

from tests.grading.mutants import MUTANTS, apply
from tests.grading.test_verdicts import SEEDS, _namespace, judge_in_process

EX17 = "ex17_serving_attention"
EX17_MUTANTS = [m for m in MUTANTS if m.notebook == EX17]
#: the mistakes issue 39 asks the new parts to catch
REQUIRED = {"preempted_blocks_never_freed", "preempted_loses_generated_tokens", "paged_tail_not_masked",
            "paged_no_rescale"}


def test_the_new_parts_have_their_mutants():
    assert REQUIRED <= {m.name for m in EX17_MUTANTS}


@pytest.mark.parametrize("mutant", EX17_MUTANTS, ids=[m.name for m in EX17_MUTANTS])
def test_ex17_mutant_scores_the_same_on_every_draw(mutant):
    exercise, namespace = _namespace(apply(mutant))
    verdicts = [judge_in_process(exercise, namespace, mutant.part, seed) for seed in SEEDS]
    scores = sorted({v.score for v in verdicts})
    assert len(scores) == 1, f"{mutant.name} scores {scores} over {len(SEEDS)} draws"
    assert scores[0] < verdicts[0].max_score, f"{mutant.name} is not caught"
    if mutant.zero:
        assert scores == [0], f"{mutant.name} must earn nothing, got {scores}"
    outcomes = {tuple(case.passed for case in v.cases) for v in verdicts}
    assert len(outcomes) == 1, f"{mutant.name}: which cases pass depends on the draw: {outcomes}"


def test_the_solution_passes_every_part_on_every_draw():
    import nbformat

    from tests.grading.mutants import SOLUTIONS

    exercise, namespace = _namespace(nbformat.read(SOLUTIONS / f"{EX17}.ipynb", as_version=4))
    for part in exercise.parts:
        for seed in SEEDS:
            verdict = judge_in_process(exercise, namespace, part.name, seed)
            assert verdict.score == verdict.max_score, f"{part.name}, seed {seed}: {verdict}"
