"""Building blocks for ``verify`` functions: each returns ``None`` when the property holds, else a message
that says exactly what is wrong ("row 2 of your weights sums to 0.73").

They accept any wire value (the learner may return anything), never raise on odd input, and phrase the
message from the learner's side: "your weights", "expected shape (2, 4, 5, 5), got (2, 5, 4, 4)".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from attention_course.grading.findings import FailureKind, Finding
from attention_course.grading.wire import describe

__all__ = [
    "f64",
    "close_f64",
    "first_problem",
    "fmt",
    "fmt_shape",
    "row_name",
    "tensor_problem",
    "finite_problem",
    "close_problem",
    "float32_atol",
    "FLOAT32_ROUNDOFF",
    "rows_sum_problem",
    "non_negative_problem",
    "scalar_problem",
    "matches",
    "tuple_problem",
]

Problem = str | None


def f64(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached and in float64, so that references and comparisons do not lose precision."""
    return t.detach().to(torch.float64)


def close_f64(actual: Any, expected: torch.Tensor, atol: float = 1e-4, rtol: float = 1e-3) -> bool:
    """True when ``actual`` is a tensor of ``expected``'s shape (no broadcasting) and close to it in float64."""
    return (isinstance(actual, torch.Tensor) and actual.shape == expected.shape
            and bool(torch.allclose(f64(actual), f64(expected), atol=atol, rtol=rtol)))


def matches(actual: Any, expected: Any, atol: float = 1e-5, rtol: float = 1e-4) -> bool:
    """Whether ``actual`` equals ``expected`` within tolerance: tensors of the same shape (float64), or
    tuples/lists of them item by item. What :func:`~attention_course.grading.spec.diagnose` uses."""
    if isinstance(expected, (tuple, list)):
        return (isinstance(actual, (tuple, list)) and len(actual) == len(expected)
                and all(matches(a, e, atol, rtol) for a, e in zip(actual, expected)))
    if isinstance(expected, torch.Tensor):
        return close_f64(actual, expected, atol=atol, rtol=rtol)
    return actual == expected


def tuple_problem(output: Any, *names: str) -> Problem:
    """``output`` must be a tuple (or list) of ``len(names)`` items, e.g. ``tuple_problem(out, "output",
    "weights")`` -> "expected a tuple (output, weights), got a tensor of shape (2, 3) ..."."""
    if isinstance(output, (tuple, list)) and len(output) == len(names):
        return None
    return Finding(f"expected a tuple ({', '.join(names)}), got {describe(output)}", FailureKind.TYPE)


def fmt(x: float) -> str:
    """A number as the learner should read it: 4 significant digits, 'NaN', 'inf'."""
    if x != x:
        return "NaN"
    return f"{x:.4g}"


def fmt_shape(shape: Sequence[int]) -> str:
    return str(tuple(int(s) for s in shape))


def row_name(index: Sequence[int]) -> str:
    """'row 2' for a matrix row, 'row 2 of batch item (1, 0)' when there are leading batch dimensions."""
    index = [int(i) for i in index]
    if len(index) <= 1:
        return f"row {index[0] if index else 0}"
    batch = index[:-1]
    return f"row {index[-1]} of batch item {batch[0] if len(batch) == 1 else tuple(batch)}"


def first_problem(*checks: Callable[[], Problem]) -> Problem:
    """Run ``checks`` in order and return the first message; later checks may assume earlier ones passed."""
    for check in checks:
        problem = check()
        if problem is not None:
            return problem
    return None


def tensor_problem(value: Any, what: str, shape: Sequence[int] | None = None, floating: bool = True) -> Problem:
    """``value`` must be a tensor (floating point unless ``floating=False``) of the given ``shape``."""
    if not isinstance(value, torch.Tensor):
        return Finding(f"expected {what} to be a torch.Tensor, got {describe(value)}", FailureKind.TYPE)
    if shape is not None and tuple(value.shape) != tuple(shape):
        return Finding(f"expected {what} of shape {fmt_shape(shape)}, got {fmt_shape(value.shape)}", FailureKind.SHAPE)
    if floating and not value.is_floating_point():
        return Finding(f"expected {what} to be a floating-point tensor, got dtype {value.dtype}", FailureKind.DTYPE)
    return None


def finite_problem(value: torch.Tensor, what: str, by_rows: bool = True, advice: str = "") -> Problem:
    """No NaN or infinity anywhere; the message names the first offending row (or index), then ``advice``."""
    bad = ~torch.isfinite(value)
    if not bad.any():
        return None
    index = [int(i) for i in bad.nonzero()[0]]
    kind = "NaN" if torch.isnan(value[tuple(index)]) else "an infinity"
    place = row_name(index[:-1]) if by_rows and value.dim() >= 2 else f"index {tuple(index)}"
    return Finding(f"{place} of {what} contains {kind}{advice}", FailureKind.NOT_FINITE)


#: The unit roundoff of float32 (2⁻²⁴), the fraction of its operands by which one float32 operation may be off.
FLOAT32_ROUNDOFF = 2.0 ** -24


def float32_atol(magnitude: float, atol: float = 1e-5, factor: float = 16.0) -> float:
    """An absolute tolerance for a float32 answer computed through numbers as large as ``magnitude``.

    A fixed tolerance suits inputs of order one. Where the computation handles much larger numbers (scores in
    the hundreds or thousands, inputs far from zero next to their spread), correct float32 code is off by a few
    times ``magnitude · 2⁻²⁴``, by a different amount for each summation order, processor and random case, so a
    fixed tolerance fails some correct answers by chance (it did: one case in 60 for ex11's tiled attention).
    ``factor`` such roundoffs are allowed on top of ``atol``; the margins test checks that correct answers stay
    well inside every tolerance over many random cases, while the mutants test checks that wrong ones fail.
    """
    return max(atol, factor * FLOAT32_ROUNDOFF * float(magnitude))


def close_problem(
    actual: torch.Tensor,
    expected: torch.Tensor,
    what: str,
    reference: str,
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> Problem:
    """``actual`` equals ``expected`` within ``atol + rtol·|expected|``; shapes must already agree.

    The message gives the largest difference and where it is: "your output differs from
    nn.MultiheadAttention by up to 0.63 (index (0, 2, 1): yours 0.12, expected 0.75)".
    """
    actual = actual.to(torch.float64)
    expected = expected.to(torch.float64)
    diff = (actual - expected).abs()
    diff = torch.where(torch.isnan(actual) | torch.isnan(expected), torch.full_like(diff, float("inf")), diff)
    allowed = atol + rtol * expected.abs().nan_to_num(posinf=0.0, neginf=0.0)
    bad = diff > allowed
    if not bad.any():
        return None
    worst = int(torch.argmax(torch.where(bad, diff, torch.zeros_like(diff)).flatten()))
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), diff.shape))
    where = f" at index {index}" if diff.dim() else ""
    verb = "differ" if what.endswith("weights") else "differs"
    return Finding(f"{what} {verb} from {reference} by up to {fmt(float(diff.flatten()[worst]))}{where}: "
                   f"yours {fmt(float(actual.flatten()[worst]))}, expected {fmt(float(expected.flatten()[worst]))}",
                   FailureKind.MISMATCH)


def rows_sum_problem(weights: torch.Tensor, what: str = "your weights", atol: float = 1e-4,
                     skip_rows: torch.Tensor | None = None) -> Problem:
    """Every row (last dimension) sums to one, except rows where ``skip_rows`` is True."""
    sums = weights.to(torch.float64).sum(dim=-1)
    bad = ~((sums - 1.0).abs() <= atol)
    if skip_rows is not None:
        bad = bad & ~skip_rows
    if not bad.any():
        return None
    index = [int(i) for i in bad.nonzero()[0]]
    return Finding(f"{row_name(index)} of {what} sums to {fmt(float(sums[tuple(index)]))} instead of 1",
                   FailureKind.PROPERTY)


def non_negative_problem(weights: torch.Tensor, what: str = "your weights") -> Problem:
    """No negative entry (attention weights are a convex combination)."""
    bad = weights < 0
    if not bad.any():
        return None
    index = [int(i) for i in bad.nonzero()[0]]
    value = float(weights[tuple(index)])
    place = row_name(index[:-1]) if weights.dim() >= 2 else "the vector"
    return Finding(f"{place} of {what} has a negative entry {fmt(value)} at key {index[-1]}", FailureKind.PROPERTY)


def scalar_problem(value: Any, what: str) -> Problem:
    """``value`` must be a real number: a Python number or a tensor with one element."""
    if isinstance(value, bool) or not isinstance(value, (int, float, torch.Tensor)):
        return Finding(f"expected {what} to be a number, got {describe(value)}", FailureKind.TYPE)
    if isinstance(value, torch.Tensor) and value.numel() != 1:
        return Finding(f"expected {what} to be a single number, got {describe(value)}", FailureKind.SHAPE)
    return None


def value_error_problem(output: Any, numbers: tuple[int, ...], why: str) -> str | None:
    """``None`` if ``output`` (from :func:`~attention_course.grading.spec.call_expecting_error`) is a ValueError
    whose message names every one of ``numbers``; otherwise what is wrong. ``why`` completes "expected a
    ValueError because ..."."""
    if not isinstance(output, dict) or not ("raised" in output or "returned" in output):
        return Finding("your output could not be read", FailureKind.NO_RESULT)
    if "returned" in output:
        return Finding(f"expected a ValueError because {why}, but your function returned normally",
                       FailureKind.EXPECTED_ERROR)
    kind, message = output["raised"], str(output.get("message", ""))
    if kind != "ValueError":
        return Finding(f"expected a ValueError because {why}, but your function raised {kind}: {message[:120]}",
                       FailureKind.EXPECTED_ERROR)
    if any(str(n) not in message for n in numbers):
        return Finding(f"your ValueError should name the offending values ({', '.join(map(str, numbers))}); "
                       f"its message is {message[:120]!r}", FailureKind.EXPECTED_ERROR)
    return None
