"""What learners are told: inputs changed in place, hints that teach without the solution's code, feedback
files, check cells and helpers from other cells, and the class summary (issue 24, item 2)."""

from __future__ import annotations

import functools
import inspect
import re
from pathlib import Path

import nbformat
import pytest
import torch

from attention_course.grading import get_exercise
from attention_course.grading.checker import Checker
from attention_course.grading.notebook_format import (
    BEGIN_SOLUTION,
    BUGGY,
    END_SOLUTION,
    TAG_GRADED,
    cell_part,
    cell_tags,
    notebook_exercise,
)
from attention_course.grading.spec import InputWatch, _TrackedRun
from tests.grading.test_checks import SOLUTIONS, namespace_of, run_check

ROOT = Path(__file__).resolve().parents[2]


# --- a. inputs changed in place: one mechanism, every part ------------------------------------------------
def _edit_in_place(value, depth: int = 0) -> bool:
    """Change the first tensor (or module parameter) found in ``value`` in place; whether one was changed."""
    if depth > 4:
        return False
    with torch.no_grad():
        if isinstance(value, torch.Tensor) and value.numel() > 0:
            try:
                if value.dtype == torch.bool:
                    value.logical_not_()
                else:
                    value.add_(1)
                return True
            except RuntimeError:  # an expanded view cannot be written to: try the next input
                return False
        if isinstance(value, torch.nn.Module):
            return any(_edit_in_place(p, depth + 1) for p in list(value.parameters())[:1])
        if isinstance(value, (list, tuple)):
            return any(_edit_in_place(item, depth + 1) for item in value)
        if isinstance(value, dict):
            return any(_edit_in_place(item, depth + 1) for item in value.values())
    return False


def _editing(obj, edits: list[int]):
    """The solution ``obj``, but changing its first editable input in place after computing its answer."""
    if inspect.isclass(obj):
        class Editing(obj):
            def forward(self, *args, **kwargs):
                output = super().forward(*args, **kwargs)
                edits.append(_edit_in_place((*args, *kwargs.values())))
                return output
        return Editing

    @functools.wraps(obj)
    def editing(*args, **kwargs):
        output = obj(*args, **kwargs)
        edits.append(_edit_in_place((*args, *kwargs.values())))
        return output
    return editing


def _has_editable_input(value, depth: int = 0) -> bool:
    if isinstance(value, (torch.Tensor, torch.nn.Module)):
        return True
    if depth < 4 and isinstance(value, (list, tuple)):
        return any(_has_editable_input(item, depth + 1) for item in value)
    if depth < 4 and isinstance(value, dict):
        return any(_has_editable_input(item, depth + 1) for item in value.values())
    return False


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.name for p in SOLUTIONS])
def test_every_part_fails_a_solution_that_changes_its_input_in_place(path):
    ex, namespace = namespace_of(path)
    for part in ex.parts:
        assert isinstance(part.run, _TrackedRun), f"{ex.id}.{part.name} bypasses the input watch"
        edits: list[bool] = []
        checker = Checker(ex, seed=0, isolated=False)
        text = " ".join(run_check(checker, part.name, _editing(namespace[part.function], edits)).split())
        if any(edits):
            assert not checker.passed(part.name), f"{ex.id}.{part.name} passes a function that edits its input"
            assert "changed its input `" in text and "in place" in text, f"{ex.id}.{part.name}: {text}"
        else:  # nothing to edit: no case hands the function a tensor or a module
            cases = part.make_cases(torch.Generator().manual_seed(0))
            assert not any(_has_editable_input((c.args, c.kwargs)) for c in cases), f"{ex.id}.{part.name}: {text}"


def test_the_watch_compares_the_tensors_passed_not_copies_of_them():
    watch = InputWatch()

    def residual(x, y):
        y += x  # the caller's tensor changes
        return y

    watched = watch.watch(residual)
    given = torch.ones(3)
    watched(torch.ones(3), given)
    assert watch.changed == ["y"] and torch.equal(given, torch.full((3,), 2.0))
    clean = InputWatch()
    clean.watch(lambda x, y: x + y)(torch.ones(3), torch.ones(3))
    assert clean.changed == []


def test_ex10_decoder_layer_with_in_place_residual_loses_its_points():
    path = ROOT / "exercises" / "solutions" / "ex10_decoder_and_transformer.ipynb"
    ex, namespace = namespace_of(path)
    cell = next(c for c in nbformat.read(path, as_version=4).cells
                if TAG_GRADED in cell_tags(c) and cell_part(c) == "decoder_layer_forward")
    assert "y = y + " in cell.source
    scope = dict(namespace)
    exec(cell.source.replace("y = y + ", "y += "), scope)  # the learner's `y += ...` on the caller's y
    checker = Checker(ex, seed=0, isolated=False)
    text = " ".join(run_check(checker, "decoder_layer_forward", scope["decoder_layer_forward"]).split())
    assert not checker.passed("decoder_layer_forward")
    assert "your function changed its input `y` in place" in text
    assert checker._verdicts["decoder_layer_forward"].score < ex.part("decoder_layer_forward").points


# --- b. hints without any expression of the solution -------------------------------------------------------
# Hint text and solution code are compared as tokens: Python's identifiers, numbers and operators, with
# whitespace, quotes and backticks dropped (so `dim = -1` and "dim=-1" are the same four tokens). A hint fails
# when it shares a run of at least RUN_TOKENS consecutive tokens with the solution code of its exercise and the
# run holds a call or an index (a name, `)` or `]` followed by `(` or `[`). Why 6: the shortest give-away the
# issue lists, `tokens[:, 1:]`, is 7 tokens, and a method call with two arguments, `.transpose(1, 2)`, is 6;
# while 5 tokens leave prose room to name a function or a keyword (`F.cross_entropy`, `dim=-1)`, `sqrt(d_k)`),
# which teaches what to look up without writing the line.
RUN_TOKENS = 6
_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+|\*\*|//|->|==|!=|<=|>=|<<|>>"
                    r"|[-+*/%@&|^~<>]=?|[()\[\]{},:.;=]")


def code_tokens(text: str) -> list[str]:
    """``text`` (code or prose) as normalised Python tokens."""
    return _TOKEN.findall(text.translate(str.maketrans({"'": " ", '"': " ", "`": " "})))


def solution_code(path: Path) -> str:
    """The solution blocks of every graded cell of a solution notebook, comments dropped."""
    lines: list[str] = []
    for cell in nbformat.read(path, as_version=4).cells:
        if TAG_GRADED not in cell_tags(cell):
            continue
        inside = False
        for line in cell.source.splitlines():
            if line.strip() == BEGIN_SOLUTION:
                inside = True
            elif line.strip() in (END_SOLUTION, BUGGY):
                inside = False
            elif inside:
                lines.append(line.split("#")[0])
    return "\n".join(lines)


def shared_expressions(hint: str, solution: str, length: int = RUN_TOKENS) -> list[str]:
    """The runs of at least ``length`` tokens that ``hint`` shares with ``solution`` and that hold a call or an
    index, each as the longest such run from where it starts."""
    said, code = code_tokens(hint), code_tokens(solution)
    starts: dict[tuple[str, ...], list[int]] = {}
    for j in range(len(code) - length + 1):
        starts.setdefault(tuple(code[j:j + length]), []).append(j)
    found, i = [], 0
    while i <= len(said) - length:
        if tuple(said[i:i + length]) not in starts:
            i += 1
            continue
        longest = length
        for j in starts[tuple(said[i:i + length])]:
            k = length
            while i + k < len(said) and j + k < len(code) and said[i + k] == code[j + k]:
                k += 1
            longest = max(longest, k)
        run = said[i:i + longest]
        if any((a[0].isalpha() or a[0] == "_" or a in ")]") and b in "([" for a, b in zip(run, run[1:])):
            found.append(" ".join(run))
        i += longest
    return found


NOTEBOOK_OF = {notebook_exercise(nbformat.read(path, as_version=4)): path for path in SOLUTIONS}


@pytest.mark.parametrize("exercise_id", sorted(NOTEBOOK_OF))
def test_no_hint_holds_an_expression_of_the_solution(exercise_id):
    solution = solution_code(NOTEBOOK_OF[exercise_id])
    assert len(code_tokens(solution)) > 50
    for part in get_exercise(exercise_id).parts:
        for level, hint in enumerate(part.hints, start=1):
            shared = shared_expressions(hint, solution)
            assert not shared, f"{exercise_id}.{part.name} hint {level} writes the solution's code: {shared}"


# The level-2 hints the issue found giving the solution away, word for word.
GIVEN_AWAY = [
    ("ex13", "torch.topk(logits, k, dim=-1).values[..., -1:] is each row's k-th largest value; every logit below "
             "it is dropped (masked_fill with -inf)."),
    ("ex13", "The predictions are logits[:, :-1], the targets tokens[:, 1:]. Flatten both and use F.cross_entropy."),
    ("ex05", "Fill the blocked scores (where the mask is False: scores.masked_fill(~mask, value)) with "
             "torch.finfo(scores.dtype).min rather than -inf, then zero the rows with no allowed key: "
             "mask.any(dim=-1, keepdim=True) is False exactly there."),
    ("ex05", "Write a helper causal_mask(L) = torch.ones(L, L, dtype=torch.bool).tril()."),
]


@pytest.mark.parametrize(("exercise_id", "hint"), GIVEN_AWAY)
def test_the_hints_that_gave_the_solution_away_are_caught(exercise_id, hint):
    shared = shared_expressions(hint, solution_code(NOTEBOOK_OF[exercise_id]))
    assert shared and all(len(run.split()) >= RUN_TOKENS for run in shared), shared
    # Naming what to use, without writing the line, passes.
    assert not shared_expressions("use F.cross_entropy with ignore_index; dim=-1, sqrt(d_k), torch.topk",
                                  solution_code(NOTEBOOK_OF[exercise_id]))
