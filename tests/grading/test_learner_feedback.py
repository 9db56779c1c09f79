"""What learners are told: inputs changed in place, hints that teach without the solution's code, feedback
files, check cells and helpers from other cells, and the class summary (issue 24, item 2)."""

from __future__ import annotations

import functools
import inspect
from pathlib import Path

import nbformat
import pytest
import torch

from attention_course.grading.checker import Checker
from attention_course.grading.notebook_format import TAG_GRADED, cell_part, cell_tags
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
