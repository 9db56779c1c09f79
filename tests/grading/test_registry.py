"""Each exercise is one registered unit (checks, chapters, library allowances, hints) covered by mutants and a
simulated learner, and every verdict carries a typed failure kind apart from its message."""

from __future__ import annotations

import io
import re
from contextlib import redirect_stdout
from pathlib import Path

import nbformat
import pytest
import torch

import attention_course as ac
from attention_course.grading.checker import Checker
from attention_course.grading.compare import (
    close_problem,
    finite_problem,
    rows_sum_problem,
    tensor_problem,
    tuple_problem,
    value_error_problem,
)
from attention_course.grading.declare import Check, Out, distribution, second_run
from attention_course.grading.exercises import exercise_ids, get_exercise
from attention_course.grading.findings import FailureKind, Finding, kind_of
from attention_course.grading.judge import judge_case, judge_part
from attention_course.grading.library_rules import part_table
from attention_course.grading.report import failure_kinds
from attention_course.grading.spec import Case, Exercise, Mistake, Part, inputs_changed_message, with_texts
from tests.grading.learners import LEARNERS
from tests.grading.mutants import MUTANTS

ROOT = Path(__file__).resolve().parents[2]


def _solution_stems() -> dict[str, str]:
    """exercise id -> stem of its solution notebook."""
    stems = {}
    for path in (ROOT / "exercises" / "solutions").glob("*.ipynb"):
        stems[nbformat.read(path, as_version=4).metadata["grading"]["exercise"]] = path.stem
    return stems


@pytest.mark.parametrize("exercise_id", exercise_ids())
def test_every_part_has_a_mutant_and_a_simulated_learner(exercise_id):
    exercise, stem = get_exercise(exercise_id), _solution_stems()[exercise_id]
    mutated = {m.part for m in MUTANTS if m.notebook == stem}
    assert [p.name for p in exercise.parts if p.name not in mutated] == [], "parts without a mutant"
    # A simulated learner's notebook is graded part by part, so each of its exercise's parts is covered.
    assert any(learner.notebook == stem for learner in LEARNERS), f"{exercise_id} has no simulated learner"


@pytest.mark.parametrize("exercise_id", exercise_ids())
def test_every_exercise_names_its_chapters_allowances_and_hints(exercise_id):
    exercise = get_exercise(exercise_id)
    assert exercise.chapters, f"{exercise_id} names no chapter"
    for chapter in exercise.chapters:
        assert (ROOT / "chapters" / f"{chapter}.ipynb").exists(), chapter
    assert part_table(exercise_id) == {part: frozenset(names) for part, names in exercise.allowed.items()}
    for names in exercise.allowed.values():
        assert names and all(hasattr(ac, name) for name in names)
    assert exercise.title and all(len(part.hints) == 2 and part.summary for part in exercise.parts)


def _texts_file(tmp_path, body: str) -> Path:
    path = tmp_path / "exNN.toml"
    path.write_text(body)
    return path


def _part(name: str) -> Part:
    return Part(name=name, make_cases=lambda g: [Case("c", (torch.zeros(1),))], verify=lambda case, output: None)


_TWO_PARTS = Exercise(id="exNN", preamble="", parts=(_part("first"), _part("second")))
_GOOD = """title = "Two parts"
[parts.first]
summary = "the first"
concept = '''
a concept wrapped
over two lines
'''
approach = "an approach"
[parts.second]
summary = "the second"
concept = "c"
approach = "a"
"""


def test_texts_come_from_the_exercises_file_with_its_wrapping_folded(tmp_path):
    exercise = with_texts(_TWO_PARTS, _texts_file(tmp_path, _GOOD))
    assert exercise.title == "Two parts"
    assert exercise.part("first").hints == ("a concept wrapped over two lines", "an approach")
    assert exercise.part("second").summary == "the second"


@pytest.mark.parametrize("change, named", [
    (lambda text: text.replace('approach = "a"\n', ""), "[parts.second] must hold exactly"),
    (lambda text: text + '[parts.third]\nsummary = "s"\n', "no parts ['third']"),
    (lambda text: text.replace('summary = "the first"', 'summary = "  "'), "first.summary must be a non-empty"),
    (lambda text: text.replace("[parts.second]", "[parts.second]\nhint = 'x'"), "got ['approach', 'concept', 'hint'"),
    (lambda text: "author = 'me'\n" + text, "unknown top-level keys ['author']"),
])
def test_a_texts_file_that_does_not_fit_its_exercise_is_refused(tmp_path, change, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        with_texts(_TWO_PARTS, _texts_file(tmp_path, change(_GOOD)))


def test_every_exercise_has_its_texts_file_and_no_other_is_left():
    folder = ROOT / "src" / "attention_course" / "grading" / "exercises"
    assert sorted(path.stem for path in folder.glob("*.toml")) == exercise_ids()


def test_library_allowances_live_in_the_exercises():
    assert part_table("ex09")["encoder_layer"] >= {"MultiHeadAttention", "LayerNorm"}
    assert "causal_mask" in part_table("ex10")["greedy_decode"]
    assert part_table("ex03") == {}


# --- failure kinds ------------------------------------------------------------------------------------------
def test_compare_helpers_type_their_messages():
    weights = torch.tensor([[0.5, 0.5], [0.2, 0.8], [0.5, 0.23]])
    assert kind_of(rows_sum_problem(weights)) is FailureKind.PROPERTY
    assert kind_of(tensor_problem("no", "your output")) is FailureKind.TYPE
    assert kind_of(tensor_problem(weights, "your output", (2, 2))) is FailureKind.SHAPE
    assert kind_of(tensor_problem(weights.long(), "your output", (3, 2))) is FailureKind.DTYPE
    assert kind_of(finite_problem(torch.tensor([[1.0, float("nan")]]), "your output")) is FailureKind.NOT_FINITE
    assert kind_of(close_problem(weights, weights + 1, "your weights", "the reference")) is FailureKind.MISMATCH
    assert kind_of(tuple_problem(weights, "output", "weights")) is FailureKind.TYPE
    assert kind_of(value_error_problem({"returned": 1}, (2,), "why")) is FailureKind.EXPECTED_ERROR
    assert kind_of(inputs_changed_message(["q"])) is FailureKind.IN_PLACE
    assert kind_of("a plain message") is FailureKind.OTHER
    amended = Finding("row 1 differs", FailureKind.MISMATCH) + "; a note"
    assert amended == "row 1 differs; a note" and amended.kind is FailureKind.MISMATCH


def _softmax_part() -> Part:
    check = Check(
        reference=lambda v: torch.softmax(v.x[0], dim=-1),
        outputs=(Out("weights", "torch.softmax(scores, dim=-1)"),),
        properties=(distribution("weights"),),
        mistakes=(Mistake(lambda v: torch.softmax(2 * v.x[0], dim=-1), "your scores are doubled"),),
    )
    return Part(name="softmax", hint="a hint", make_cases=lambda g: [Case("c", (torch.randn(2, 3, generator=g),))],
                verify=check)


@pytest.mark.parametrize(("answer", "kind"), [
    (lambda s: torch.softmax(s, dim=-1), None),
    (lambda s: s, FailureKind.PROPERTY),
    (lambda s: torch.softmax(2 * s, dim=-1), FailureKind.KNOWN_MISTAKE),
    (lambda s: torch.softmax(3 * s, dim=-1), FailureKind.MISMATCH),
    (lambda s: torch.softmax(s, dim=-1)[:1].clone(), FailureKind.SHAPE),
    (lambda s: torch.full_like(s, float("nan")), FailureKind.NOT_FINITE),
    (lambda s: (s, s), FailureKind.TYPE),
])
def test_a_declared_check_says_why_a_case_failed(answer, kind):
    part = _softmax_part()
    case = part.make_cases(torch.Generator().manual_seed(0))[0]
    verdict = judge_case(part, case, {"status": "ok", "value": answer(case.args[0].clone())})
    assert verdict.kind is kind, verdict


def test_a_mistake_the_right_answer_also_matches_is_never_named():
    """On a case where a known mistake gives the right answer (here: a scale of 1), an answer just outside the
    output's tolerance is a plain mismatch, not that mistake; where the mistake differs it is still named."""
    check = Check(reference=lambda v: v.kwargs["scale"] * v.x[0], outputs=(Out("output", "scale x", atol=1e-7,
                                                                               rtol=1e-7),),
                  mistakes=(Mistake(lambda v: v.x[0], "you forgot the scale"),))
    x = torch.arange(1.0, 7.0).reshape(3, 2)
    unscaled, scaled = Case("c", (x,), {"scale": 1.0}), Case("c", (x,), {"scale": 3.0})
    nearly = x + 1e-6  # within the mistakes' matching tolerance, outside the output's
    assert kind_of(check(unscaled, nearly)) is FailureKind.MISMATCH
    assert "forgot the scale" not in check(unscaled, nearly)
    assert kind_of(check(scaled, x)) is FailureKind.KNOWN_MISTAKE and "forgot the scale" in check(scaled, x)


def test_second_run_judges_the_first_output_and_sets_the_second_aside():
    def reordered(v):  # the second run (if any) saw the rows in reverse order
        return None if v.extra is None or torch.equal(v.extra, v.got.output.flip(0)) else "not reordered"

    check = Check(reference=lambda v: 2 * v.x[0], outputs=(Out("output", "2 x"),), unpack=second_run("flip"),
                  after=(reordered,))
    x = torch.arange(6.0).reshape(3, 2)
    once, switched_off, twice = Case("c", (x,)), Case("c", (x,), data={"flip": False}), Case("c", (x,), data={"flip": 1})
    assert check(once, 2 * x) is None and check(switched_off, 2 * x) is None
    assert check(twice, (2 * x, (2 * x).flip(0))) is None
    assert check(twice, (2 * x, 2 * x)) == "not reordered"
    assert kind_of(check(twice, (3 * x, (3 * x).flip(0)))) is FailureKind.MISMATCH  # the first output is judged
    assert kind_of(check(twice, 2 * x)) is FailureKind.TYPE  # one output where the run gives two


def test_judge_types_errors_refusals_and_unwritten_parts():
    part = _softmax_part()
    case = part.make_cases(torch.Generator().manual_seed(0))[0]
    raised = judge_case(part, case, {"status": "error", "type": "ValueError", "message": "bad"})
    refused = judge_case(part, case, {"status": "error", "type": "LibraryRuleError", "message": "ac.X"})
    assert raised.kind is FailureKind.ERROR_RAISED and refused.kind is FailureKind.FORBIDDEN
    unwritten = judge_part(part, [case], [{"status": "not_implemented"}])
    assert unwritten.kind is FailureKind.NOT_IMPLEMENTED
    failed = judge_part(part, [case], [{"status": "ok", "value": case.args[0]}])
    assert failed.kind is FailureKind.PROPERTY and failed.cases[0].kind is FailureKind.PROPERTY


def test_the_notebook_check_reports_kinds_of_real_mistakes():
    checker = Checker(get_exercise("ex03"), seed=0, isolated=False)

    def soft_lookup(query, keys, values, beta):  # beta forgotten
        weights = torch.softmax(query @ keys.transpose(-2, -1), dim=-1)
        return weights @ values, weights

    def soft_lookup_in_place(query, keys, values, beta):
        query *= beta
        weights = torch.softmax(query @ keys.transpose(-2, -1), dim=-1)
        return weights @ values, weights

    for function, kind in ((soft_lookup, FailureKind.KNOWN_MISTAKE), (soft_lookup_in_place, FailureKind.IN_PLACE)):
        with redirect_stdout(io.StringIO()):
            checker.check("soft_lookup", function)
        verdict = checker._verdicts["soft_lookup"]
        assert not verdict.passed and kind in {case.kind for case in verdict.cases}, verdict


def test_the_class_summary_counts_failure_kinds_from_typed_verdicts():
    part = _softmax_part()
    case = part.make_cases(torch.Generator().manual_seed(0))[0]
    answers = [case.args[0], case.args[0], torch.softmax(2 * case.args[0], dim=-1), torch.softmax(case.args[0], -1)]
    verdicts = [judge_part(part, [case], [{"status": "ok", "value": answer}]) for answer in answers]
    assert failure_kinds(verdicts) == "property 2, known mistake 1"
    assert failure_kinds(verdicts[3:]) == ""


def _guide_block(language: str) -> str:
    """The first ``language`` code block of section 2 of exercises/README.md (the authoring guide)."""
    guide = (ROOT / "exercises" / "README.md").read_text(encoding="utf-8")
    section = guide[guide.index("## 2. The checks module"):guide.index("## 3. Check it")]
    return re.search(rf"```{language}\n(.*?)```", section, re.DOTALL).group(1)


def test_the_authoring_guide_example_is_a_working_exercise(tmp_path, monkeypatch):
    """The guide's example module, with its example texts file, loads and checks: a right answer passes every
    case, the mistake it declares gets its message, and an answer off by a constant fails."""
    from attention_course.grading import spec
    from attention_course.grading.wire import outcome_of_call

    texts = tmp_path / "exNN.toml"
    texts.write_text(_guide_block("toml"), encoding="utf-8")
    real_with_texts = spec.with_texts
    monkeypatch.setattr(spec, "with_texts", lambda exercise: real_with_texts(exercise, texts))
    namespace: dict = {}
    exec(compile(_guide_block("python"), "exercises/README.md", "exec"), namespace)
    part = namespace["EXERCISE"].part("soft_weights")
    assert part.summary and len(part.hints) == 2

    def judged(function):
        cases = part.make_cases(torch.Generator().manual_seed(0))
        return judge_part(part, cases, [outcome_of_call(lambda c=c: part.run(function, c)) for c in cases])

    assert judged(lambda scores, beta: torch.softmax(beta * scores, dim=-1)).status == "passed"
    ignores_beta = judged(lambda scores, beta: torch.softmax(scores, dim=-1))
    assert ignores_beta.status == "failed" and "ignore beta" in ignores_beta.message
    assert ignores_beta.kind == FailureKind.KNOWN_MISTAKE
    assert judged(lambda scores, beta: torch.softmax(beta * scores, dim=-1) + 0.01).status == "failed"
