"""Parts declared as data: a reference, an output spec, properties and a table of known mistakes.

Most parts are checked the same way: the output must have the reference's structure (one tensor, or a tuple
such as ``(output, weights)``), each tensor its shape, dtype and finite values; properties every right answer
has must hold (weights are distributions, outputs are invariant to a reordering); a wrong answer that equals a
known mistake gets that mistake's message; and each tensor must equal the reference within its tolerance. A
:class:`Check` declares those pieces and is the part's ``verify``::

    Part(name="soft_lookup", make_cases=_soft_cases,
         verify=Check(reference=lambda v: _soft_reference(*v.x, **v.kwargs),
                      outputs=(Out("output", "F.scaled_dot_product_attention(...)", atol=1e-4),
                               Out("weights", "softmax(beta * query @ keysᵀ)")),
                      properties=(distribution("weights"),),
                      mistakes=(Mistake(lambda v: ..., "your softmax runs over the queries", on="weights"),)))

Every step returns a typed :class:`~attention_course.grading.findings.Finding` (shape, not finite, property,
known mistake, mismatch), so the cause of a failure travels apart from its message. Free-form code remains
for unusual parts: a property or an ``after`` step is any function of the :class:`View`, and a part may
still pass a plain function as ``verify``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from attention_course.grading.compare import (
    close_problem,
    f64,
    finite_problem,
    fmt,
    matches,
    non_negative_problem,
    rows_sum_problem,
    scalar_problem,
    tensor_problem,
    tuple_problem,
    value_error_problem,
)
from attention_course.grading.findings import FailureKind, Finding, finding
from attention_course.grading.spec import Case, Mistake, diagnose

__all__ = ["Check", "Out", "View", "distribution", "mistakes_on", "second_run"]

Step = Callable[["View"], str | None]


@dataclass(frozen=True)
class Out:
    """One tensor of a part's output, named as the learner reads it (``"weights"`` -> "your weights").

    Attributes:
        name: the tensor's name in messages and in ``View.got`` / ``View.want``.
        reference: how the expected value is described ("softmax(Q Kᵀ / sqrt(d_k))"), or a function of the
            view (it may read ``View.label``, set by the reference); ``""``: the tensor is checked for
            structure and finiteness only (properties and ``after`` steps judge its values).
        atol: absolute tolerance, or a function of the :class:`View` (a tolerance that grows with the scores).
        rtol: relative tolerance, or a function of the :class:`View`.
        finite: whether NaN and infinities are refused (with the check's ``advice``).
        by_rows: whether a non-finite value is placed by row (else by index).
        floating: whether the tensor must be floating point.
        dtype: the dtype the tensor must have, as a function of the view (e.g. the input's), or ``None``.
        shape: the shape the tensor must have, as a function of the view; default: the reference's shape.
        scalar: the output is one number (a loss, a count, a ratio): a Python number or a one-element tensor,
            read as a 0-d float64 tensor (``shape``, ``floating`` and ``dtype`` do not apply).
    """

    name: str
    reference: str | Callable[[View], str] = ""
    atol: float | Callable[[View], float] = 1e-5
    rtol: float | Callable[[View], float] = 1e-4
    finite: bool = True
    by_rows: bool = True
    floating: bool = True
    dtype: Callable[[View], torch.dtype] | None = None
    shape: Callable[[View], Sequence[int]] | None = None
    scalar: bool = False

    def tolerances(self, view: View) -> tuple[float, float]:
        """``(atol, rtol)`` for ``view`` (either may depend on the case)."""
        return (self.atol(view) if callable(self.atol) else self.atol,
                self.rtol(view) if callable(self.rtol) else self.rtol)


@dataclass
class View:
    """What a check's steps read: the case, its inputs, and the learner's and the reference's tensors.

    ``x`` holds the positional arguments with every floating tensor in float64 (other values as they are);
    ``got`` and ``want`` name the learner's and the expected tensors after the outputs' names
    (``v.got.weights``), once the structure is known to be right; ``output`` is the learner's raw output.
    """

    case: Case
    output: Any
    x: tuple = ()
    got: SimpleNamespace = field(default_factory=SimpleNamespace)
    want: SimpleNamespace = field(default_factory=SimpleNamespace)
    extra: Any = None  # what an ``unpack`` step set aside (e.g. the output on reordered inputs)
    label: str = ""  # a name the reference function may give what it computed ("nn.MultiheadAttention")

    @property
    def args(self) -> tuple:
        return self.case.args

    @property
    def kwargs(self) -> dict[str, Any]:
        return self.case.kwargs

    @property
    def data(self) -> dict[str, Any]:
        return self.case.data


def _float64(value: Any) -> Any:
    return f64(value) if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def _first_problem(steps: Sequence[Step], view: View, kind: FailureKind) -> Finding | None:
    """The first message any of ``steps`` gives for ``view``, typed as ``kind`` (None: every step passed)."""
    for step in steps:
        problem = step(view)
        if problem:
            return finding(problem, kind)
    return None


def distribution(name: str = "weights", skip: Callable[[View], torch.Tensor | None] | None = None) -> Step:
    """The property of attention weights: no negative entry, and every row sums to one (except the rows
    ``skip`` marks, e.g. fully masked rows)."""
    def step(view: View) -> str | None:
        weights = getattr(view.got, name)
        problem = non_negative_problem(weights, f"your {name}")
        if problem or weights.dim() > 1:
            return problem or rows_sum_problem(weights, f"your {name}", skip_rows=skip(view) if skip else None)
        total = float(weights.double().sum())
        return None if abs(total - 1) <= 1e-4 else f"your {name} sum to {fmt(total)} instead of 1"
    return step


def mistakes_on(table: Sequence[Mistake], inputs: Callable[[View], tuple], on: str = "") -> tuple[Mistake, ...]:
    """A table of mistakes written on plain inputs (``variant(*inputs)``, as
    :func:`~attention_course.grading.spec.diagnose` takes them) for a :class:`Check`: ``inputs(view)`` gives
    those inputs, ``on`` the output the variants compute. One table then serves several parts (the same softmax
    mistakes on other tensors)."""
    def message(mistake: Mistake) -> str | Callable[[View], str]:
        if not callable(mistake.message):
            return mistake.message
        return lambda v: mistake.message(*inputs(v))

    return tuple(Mistake(lambda v, m=m: m.variant(*inputs(v)), message(m), on=on or m.on) for m in table)


def second_run(*keys: str, message: str = "your output could not be read") -> Step:
    """An ``unpack`` step for a part whose ``run`` calls the learner's function a second time on the cases
    that have one of ``keys`` in ``case.data`` (changed future tokens, reordered inputs; a key set to
    ``False`` does not count) and returns ``(first, second)``: the first output is judged as usual, the second
    is set aside in ``View.extra`` for a step that compares the two (an invariance). ``message``: what a
    malformed pair is told."""
    def step(view: View) -> str | None:
        if any(view.data.get(key, False) is not False for key in keys):
            if not isinstance(view.output, (tuple, list)) or len(view.output) != 2:
                return message
            view.output, view.extra = view.output
        return None
    return step


@dataclass(frozen=True)
class Check:
    """A part's ``verify`` declared as data; see the module docstring.

    The steps run in this order, and the first message wins (later steps may assume earlier ones held):

    1. ``raises`` (optional): ``view -> (numbers, why)`` for a case that must raise a ValueError whose message
       names the numbers (run the part with ``spec.call_expecting_error``);
    2. ``unpack`` (optional): ``view -> message or None``; may replace ``view.output`` and set ``view.extra``
       (a ``run`` that returns more than the function's output, e.g. the output on permuted inputs);
    3. ``reference(view)``: the expected tensor, or tuple in the order of ``outputs`` (float64);
    4. ``before``: steps on the raw output (a precise message for a transposed shape, a wrong column count);
    5. structure: a tuple of ``len(outputs)`` items when there are several; each a (floating) tensor of the
       expected shape and dtype, or one number (``Out.scalar``); finite values (NaN or infinity named, with
       ``advice``);
    6. ``properties``: steps every right answer passes (messages typed as properties);
    7. ``mistakes``: when an output differs from its reference, the first known mistake it equals (each
       :class:`~attention_course.grading.spec.Mistake`'s ``variant(view)`` computes that wrong output;
       ``on`` names the output it is compared with, default the first);
    8. ``explain``: steps that say more precisely what is wrong (which head holds which features), typed
       ``FailureKind.MISMATCH`` unless they say otherwise;
    9. closeness of each output with a ``reference`` description, in the order ``compare`` names (default:
       the order of ``outputs``; finiteness and mistakes are checked in that order too);
    10. ``after``: the remaining steps (invariances that need a right output first).
    """

    reference: Callable[[View], Any]
    outputs: tuple[Out, ...] = (Out("output", "the reference"),)
    before: tuple[Step, ...] = ()
    properties: tuple[Step, ...] = ()
    mistakes: tuple[Mistake, ...] = ()
    matches: Callable[[Any, Any], bool] | None = None  # how an output is compared with a mistake (default: close)
    explain: tuple[Step, ...] = ()
    after: tuple[Step, ...] = ()
    advice: str | Callable[[View], str] = ""
    unpack: Step | None = None
    raises: Callable[[View], tuple[Sequence[int], str] | None] | None = None
    compare: tuple[str, ...] = ()  # the outputs' names in the order they are compared (default: as declared)

    def __call__(self, case: Case, output: Any) -> str | None:
        view = View(case, output, tuple(_float64(arg) for arg in case.args))
        demanded = self.raises(view) if self.raises is not None else None
        if demanded is not None:  # the case must raise a ValueError naming these numbers
            return value_error_problem(output, tuple(demanded[0]), demanded[1])
        if self.unpack is not None:
            problem = self.unpack(view)
            if problem:
                return finding(problem, FailureKind.TYPE)
        expected = self.reference(view)
        expected = expected if isinstance(expected, tuple) else (expected,)
        for out, want in zip(self.outputs, expected):
            setattr(view.want, out.name, want)
        problem = _first_problem(self.before, view, FailureKind.SHAPE)
        if problem:
            return problem
        problem = self._structure(view)
        if problem:
            return problem
        problem = _first_problem(self.properties, view, FailureKind.PROPERTY)
        if problem:
            return problem
        problem = self._mistake(view)
        if problem:
            return problem
        problem = _first_problem(self.explain, view, FailureKind.MISMATCH)
        if problem:
            return problem
        for out in self._in_order():
            if out.reference:  # not matched by a known mistake: the plain difference
                atol, rtol = out.tolerances(view)
                reference = out.reference(view) if callable(out.reference) else out.reference
                problem = close_problem(getattr(view.got, out.name), getattr(view.want, out.name),
                                        f"your {out.name}", reference, atol=atol, rtol=rtol)
                if problem:
                    return problem
        for step in self.after:
            problem = step(view)
            if problem:
                return finding(problem, FailureKind.PROPERTY)
        return None

    def _structure(self, view: View) -> str | None:
        output = view.output
        if len(self.outputs) > 1:
            problem = tuple_problem(output, *(out.name for out in self.outputs))
            if problem:
                return problem
            pieces = tuple(output)
        else:
            pieces = (output,)
        for out, piece in zip(self.outputs, pieces):
            if out.scalar:  # one number: read as a 0-d float64 tensor once it is known to be one
                problem = scalar_problem(piece, f"your {out.name}")
                if problem:
                    return problem
                piece = f64(piece).reshape(()) if isinstance(piece, torch.Tensor) else torch.tensor(
                    float(piece), dtype=torch.float64)
            setattr(view.got, out.name, piece)
        for out in self.outputs:
            piece = getattr(view.got, out.name)
            if out.scalar:
                continue
            shape = out.shape(view) if out.shape else getattr(view.want, out.name).shape
            problem = tensor_problem(piece, f"your {out.name}", shape, floating=out.floating)
            if problem:
                return problem
            if out.dtype is not None and piece.dtype != out.dtype(view):
                return Finding(f"expected your {out.name} in {out.dtype(view)} (the dtype of the inputs), got "
                               f"{piece.dtype}", FailureKind.DTYPE)
        for out in self._in_order():
            piece = getattr(view.got, out.name)
            if out.finite and not out.scalar and piece.is_floating_point():  # a NaN number: its mismatch says so
                advice = self.advice(view) if callable(self.advice) else self.advice
                problem = finite_problem(piece, f"your {out.name}", by_rows=out.by_rows, advice=advice)
                if problem:
                    return problem
        return None

    def _in_order(self) -> list[Out]:
        by_name = {out.name: out for out in self.outputs}
        return [by_name[name] for name in self.compare] + [o for o in self.outputs if o.name not in self.compare]

    @staticmethod
    def _close(view: View, out: Out, got: torch.Tensor, want: torch.Tensor) -> bool:
        """Whether ``got`` is right within the output's tolerance (a right answer is never diagnosed)."""
        if not out.reference:
            return matches(got, want)
        atol, rtol = out.tolerances(view)
        return close_problem(got, want, "", "", atol=atol, rtol=rtol) is None

    def _mistake(self, view: View) -> str | None:
        if not self.mistakes:
            return None
        for out in self._in_order():
            got, want = getattr(view.got, out.name), getattr(view.want, out.name)
            if self._close(view, out, got, want):
                continue
            mistakes = [m for m in self.mistakes if (m.on or self.outputs[0].name) == out.name]
            problem = diagnose(mistakes, got, view, matches=self.matches, right=want)
            if problem:
                return problem
        return None
