"""Exercise 08, LayerNorm, dropout and residual connections: the checks behind
``exercises/ex08_layernorm_dropout_residuals.ipynb``.

The learner writes layer normalisation, inverted dropout, a residual sub-layer in both norm orders and an
``AddAndNorm`` module. References: ``F.layer_norm`` or float64 code here; recognised mistakes: unbiased variance,
eps outside the root, the norm orders swapped, dropout in the wrong place.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from attention_course.grading.compare import close_f64, close_problem, f64, finite_problem, fmt, tensor_problem
from attention_course.grading.declare import Check, Out, View, mistakes_on
from attention_course.grading.findings import FailureKind, Finding
from attention_course.grading.spec import Case, Exercise, Mistake, Part, call_function, preamble, randn, with_texts

PREAMBLE = preamble(nn=True)


# Sub-layers and norms handed to the learner's code: module-level functions (picklable), bound with partial.
def _tanh_linear(weight: torch.Tensor, bias: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A stand-in sub-layer f(x) = tanh(x W + b), (..., d) -> (..., d)."""
    return torch.tanh(torch.matmul(x, weight.to(x.dtype)) + bias.to(x.dtype))


def _affine_norm(weight: torch.Tensor, bias: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A LayerNorm with the given gain and bias, (..., d) -> (..., d)."""
    return F.layer_norm(x, (x.shape[-1],), weight.to(x.dtype), bias.to(x.dtype), 1e-5)


def _block(x: torch.Tensor, f: Callable, norm: Callable, norm_first: bool) -> torch.Tensor:
    """A residual sub-layer: pre-norm x + f(norm(x)), or post-norm norm(x + f(x))."""
    return x + f(norm(x)) if norm_first else norm(x + f(x))


def _drop_tolerance(p: float, n: int) -> float:
    """Six standard deviations of the fraction dropped among n entries: a right dropout never misses by more."""
    return 6.0 * math.sqrt(p * (1.0 - p) / n)


# --- part 1: layer_norm -------------------------------------------------------------------------------
def _layer_norm_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, x: torch.Tensor, eps: float = 1e-5) -> Case:
        d = x.shape[-1]
        weight = (1.0 + randn(g, d, scale=0.3)).to(x.dtype)
        bias = randn(g, d, scale=0.3).to(x.dtype)
        return Case(name, (x, weight, bias), {"eps": eps})

    constant = randn(g, 3, 8)
    constant[1] = 2.5  # one row with zero variance
    return [
        case("x (4, 10) with a random gain and bias", randn(g, 4, 10)),
        case("a batch of sequences, x (2, 5, 16)", randn(g, 2, 5, 16, scale=3.0)),
        case("offset inputs: mean about 100, std about 2, (3, 12)", 100.0 + randn(g, 3, 12, scale=2.0)),
        case("small spread: std about 1e-3, (3, 32) (where eps matters)", randn(g, 3, 32, scale=1e-3)),
        case("a constant row (zero variance) must give the bias, not NaN", constant),
        case("eps = 0.1, (2, 6)", randn(g, 2, 6, scale=0.5), eps=0.1),
        case("float64 input keeps its dtype, (3, 7)", randn(g, 3, 7, dtype=torch.float64)),
    ]


def _centred(x: torch.Tensor) -> torch.Tensor:
    return x - x.mean(-1, keepdim=True)


_LAYER_NORM_MISTAKES = (  # (x, weight, bias, eps), float64 -> a wrong LayerNorm
    Mistake(lambda x, w, b, eps: _centred(x) / torch.sqrt(x.var(-1, keepdim=True, correction=1) + eps) * w + b,
            "your output matches the *unbiased* variance (dividing by H - 1); LayerNorm divides by H "
            "(use correction=0 / unbiased=False)"),
    Mistake(lambda x, w, b, eps: _centred(x) / (x.std(-1, keepdim=True, correction=0) + eps) * w + b,
            "your output matches (x - mean) / (std + eps): eps belongs inside the square root, "
            "(x - mean) / sqrt(var + eps)"),
    Mistake(lambda x, w, b, eps: _centred(x) / x.std(-1, keepdim=True, correction=0) * w + b,
            "your output matches a LayerNorm without eps: add eps to the variance"),
    Mistake(lambda x, w, b, eps: F.layer_norm(x, (x.shape[-1],), eps=eps),
            "your output is normalised but ignores the gain and bias: return weight * x_hat + bias"),
)

_LAYER_NORM = Check(
    reference=lambda v: F.layer_norm(v.x[0], (v.x[0].shape[-1],), v.x[1], v.x[2], v.kwargs["eps"]),
    outputs=(Out("output", "F.layer_norm (nn.LayerNorm)", atol=1e-4, rtol=1e-3, dtype=lambda v: v.args[0].dtype),),
    mistakes=mistakes_on(_LAYER_NORM_MISTAKES, lambda v: (*v.x, v.kwargs["eps"])),
    matches=close_f64,  # never matches a NaN or infinite variant: the output is known to be finite by then
)


# --- part 2: dropout -------------------------------------------------------------------------------------
def _dropout_cases(g: torch.Generator) -> list[Case]:
    def x(*shape: int) -> torch.Tensor:
        sign = torch.where(torch.rand(*shape, generator=g) < 0.5, -1.0, 1.0)
        return sign * (0.5 + torch.rand(*shape, generator=g))  # never zero, so a dropped entry is visible

    return [
        Case("training, p = 0.2, x (200, 500)", (x(200, 500),), {"p": 0.2, "training": True}),
        Case("training, p = 0.5, x (4, 100, 100)", (x(4, 100, 100),), {"p": 0.5, "training": True}),
        Case("training, p = 0.9, x (300, 300)", (x(300, 300),), {"p": 0.9, "training": True}),
        Case("evaluation (training=False) returns the input unchanged", (x(30, 40),), {"p": 0.3, "training": False}),
        Case("p = 0 keeps everything", (x(50, 50),), {"p": 0.0, "training": True}),
        Case("p = 1 drops everything, without NaN", (x(20, 20),), {"p": 1.0, "training": True}),
        Case("float64 input keeps its dtype", (x(100, 100).double(),), {"p": 0.3, "training": True}),
    ]


def _called_twice(case: Case) -> bool:
    """Whether dropout is random on this case, so that two calls must draw different masks."""
    return case.kwargs["training"] and 0.0 < case.kwargs["p"] < 1.0


def run_dropout(obj: Any, case: Case) -> Any:
    """Call ``dropout(x, p=..., training=...)``; twice where it draws a random mask (the bug hunt's too)."""
    return (call_function(obj, case), call_function(obj, case)) if _called_twice(case) else call_function(obj, case)


def verify_dropout(case: Case, output: Any) -> str | None:
    """Inverted dropout's contract, on one case of ``dropout(x, p, training)`` (the bug hunt's part 7 too)."""
    x, p, training = case.args[0], case.kwargs["p"], case.kwargs["training"]
    if _called_twice(case) and (not isinstance(output, tuple) or len(output) != 2):
        return Finding(f"expected your function to return a tensor, got {type(output).__name__}", FailureKind.TYPE)
    first, second = output if _called_twice(case) else (output, None)
    if problem := tensor_problem(first, "your output", x.shape):
        return problem
    if first.dtype != x.dtype:
        return Finding(f"expected dtype {x.dtype} (the input's), got {first.dtype}", FailureKind.DTYPE)
    if p == 1.0 and training and not bool(torch.isfinite(first).all()):
        return Finding("with p = 1 your output holds NaN or infinity: every entry is dropped, and scaling by "
                       "1/(1 - p) divides by zero; return zeros for p = 1", FailureKind.NOT_FINITE)
    if problem := finite_problem(first, "your output", by_rows=False):
        return problem
    out, x = f64(first), f64(x)
    if not training or p == 0.0:
        if torch.equal(out, x):
            return None
        when, difference = "in evaluation mode" if not training else "with p = 0", float((out - x).abs().max())
        return Finding(f"{when} dropout must return its input unchanged (no zeros, no rescaling); yours differs by "
                       f"up to {fmt(difference)}", FailureKind.MISMATCH)
    if p == 1.0:
        return None if bool((out == 0).all()) else Finding("with p = 1 every entry must be zero", FailureKind.MISMATCH)
    return _random_dropout_problem(out, x, p, second)


def _random_dropout_problem(out: torch.Tensor, x: torch.Tensor, p: float, second: Any) -> Finding | None:
    """Training with 0 < p < 1: independent drops at rate p, survivors scaled by 1/(1 - p), a new mask per call."""
    kept = out != 0
    matrix = kept.reshape(-1, x.shape[-1])
    if bool((~matrix).all(dim=1).any()) or bool((~matrix).all(dim=0).any()):  # one draw shared by a row or column
        return Finding("whole rows or columns of your output are zero: draw an independent keep/drop for every "
                       "element", FailureKind.KNOWN_MISTAKE)
    dropped, tolerance = 1.0 - float(kept.double().mean()), _drop_tolerance(p, x.numel())
    if abs(dropped - p) > tolerance:
        swapped = abs(dropped - (1 - p)) <= tolerance  # p taken as the probability of keeping
        hint = " (p is the probability of *dropping*, not of keeping)" if swapped else ""
        return Finding(f"about {fmt(100 * p)}% of the entries should be zero, but {fmt(100 * dropped)}% are{hint}",
                       FailureKind.KNOWN_MISTAKE if swapped else FailureKind.PROPERTY)
    ratio, scale = out[kept] / x[kept], 1.0 / (1.0 - p)
    if not torch.allclose(ratio, torch.full_like(ratio, scale), rtol=1e-5):
        return Finding(f"every surviving entry must be multiplied by 1/(1 - p) = {fmt(scale)}, so that the expected "
                       f"value stays the same; yours are multiplied by {fmt(float(ratio.mean()))} on average",
                       FailureKind.PROPERTY)
    if tensor_problem(second, "your output", x.shape) is None and torch.equal(second != 0, kept):
        return Finding("two calls dropped exactly the same entries: draw a new random mask on every call",
                       FailureKind.PROPERTY)
    return _randomness_problem(~kept, p, ~(second != 0) if tensor_problem(second, "your output", x.shape) is None
                               else None)


#: How many standard deviations a randomness statistic may stray before a mask is called not random. Measured
#: on independent drops (torch.rand) over 2000 seeds of each of ex08's four training cases, two calls each: the
#: largest |z| of the 24 000 statistics was 4.42, as expected of normal ones (tests/grading/test_checks.py::
#: test_dropout_randomness_false_alarm_rate repeats this on 200 seeds); a normal statistic strays beyond 7 with
#: probability 3e-12, so a right dropout fails by chance about once in 10^10 cases.
RANDOMNESS_Z = 7.0


def dropout_randomness(dropped: torch.Tensor, p: float, second: torch.Tensor | None = None) -> dict[str, float]:
    """z-scores of three statistics of a dropout mask (``dropped``: True where an entry was zeroed), each about
    standard normal for independent drops at rate ``p``:

    - ``neighbours``: pairs of neighbouring entries (along the last dimension) both dropped, expected p^2 per
      pair (a low-discrepancy or striped mask spreads its drops apart, or clumps them);
    - ``rows``: the spread of the number dropped per row (a chi-square dispersion index; a mask that drops
      exactly p of every row spreads them too evenly, z far below 0);
    - ``calls``: entries dropped by both of two calls (``second``), expected p^2 each (a mask that moves
      deterministically from call to call overlaps too much or too little).
    """
    d = dropped.reshape(-1, dropped.shape[-1]).double()
    rows, n = d.shape
    q = p * p
    z: dict[str, float] = {}
    if n > 1:
        pairs = rows * (n - 1)
        both = float((d[:, 1:] * d[:, :-1]).sum())
        # overlapping pairs share an entry: Var = m q (1 - q) + 2 (m - rows) (p^3 - p^4)
        variance = pairs * q * (1 - q) + 2 * (pairs - rows) * (p ** 3 - q * q)
        z["neighbours"] = (both - pairs * q) / math.sqrt(variance)
    if rows > 1:
        counts = d.sum(dim=1)
        dispersion = float(((counts - n * p) ** 2).sum()) / (n * p * (1 - p))
        z["rows"] = (dispersion - rows) / math.sqrt(2 * rows)
    if second is not None:
        total = d.numel()
        both = float((d.reshape(-1) * second.reshape(-1).double()).sum())
        z["calls"] = (both - total * q) / math.sqrt(total * q * (1 - q))
    return z


def _randomness_problem(dropped: torch.Tensor, p: float, second: torch.Tensor | None) -> Finding | None:
    """A mask that drops about p of the entries but not independently at random (see :func:`dropout_randomness`)."""
    z = dropout_randomness(dropped, p, second)
    if abs(z.get("neighbours", 0.0)) > RANDOMNESS_Z:
        both = float((dropped.reshape(-1, dropped.shape[-1])[:, 1:] & dropped.reshape(-1, dropped.shape[-1])[:, :-1])
                     .double().mean())
        return Finding(f"your mask is not random: neighbouring entries are both dropped in {fmt(100 * both)}% of "
                       f"pairs, where independent drops give p^2 = {fmt(100 * p * p)}%; draw each entry's keep/drop "
                       f"independently at random (from PyTorch's random numbers), not from a pattern or sequence",
                       FailureKind.PROPERTY)
    if z.get("rows", 0.0) < -RANDOMNESS_Z:
        return Finding("your mask is not random: every row drops almost exactly the same number of entries, where "
                       "independent random drops vary from row to row; draw each entry's keep/drop at random "
                       "(from PyTorch's random numbers), not a fixed share", FailureKind.PROPERTY)
    if abs(z.get("calls", 0.0)) > RANDOMNESS_Z:
        return Finding(f"your two calls' masks are not independent: the share of entries dropped by both is far "
                       f"from p^2 = {fmt(100 * p * p)}%; draw a new random mask on every call",
                       FailureKind.PROPERTY)
    return None


# --- part 3: residual_sublayer ---------------------------------------------------------------------------
def _residual_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, shape: tuple[int, ...], norm_first: bool, zero: bool = False, scale: float = 1.0) -> Case:
        d = shape[-1]
        x = randn(g, *shape, scale=scale)
        sublayer = (torch.zeros_like if zero else  # a residual block that does nothing
                    functools.partial(_tanh_linear, randn(g, d, d, scale=d**-0.5), randn(g, d, scale=0.1)))
        norm = functools.partial(_affine_norm, 1.0 + randn(g, d, scale=0.3), randn(g, d, scale=0.3))
        return Case(name, (x, sublayer, norm), {"norm_first": norm_first})

    return [
        case("post-norm, x (2, 5, 8)", (2, 5, 8), False),
        case("pre-norm, x (2, 5, 8)", (2, 5, 8), True),
        case("post-norm, x (3, 4, 16) with large values (std 5)", (3, 4, 16), False, scale=5.0),
        case("pre-norm, x (3, 4, 16) with large values (std 5)", (3, 4, 16), True, scale=5.0),
        case("post-norm around a sub-layer that returns zeros: LayerNorm(x)", (2, 6, 8), False, zero=True),
        case("pre-norm around a sub-layer that returns zeros: x itself", (2, 6, 8), True, zero=True),
    ]


_RESIDUAL_MISTAKES = (  # (x, f, norm, norm_first), float64 -> a wrong residual block
    Mistake(lambda x, f, n, norm_first: _block(x, f, n, not norm_first),
            lambda x, f, n, norm_first: f"your output is the {'post' if norm_first else 'pre'}-norm result; with "
            f"norm_first={norm_first} it should be the "
            f"{'pre-norm x + f(norm(x))' if norm_first else 'post-norm norm(x + f(x))'}"),
    Mistake(lambda x, f, n, norm_first: n(x) + f(n(x)),
            "you added the *normalised* input; pre-norm adds the raw input: x + f(norm(x))"),
    Mistake(lambda x, f, n, norm_first: n(f(x)), "you left out the residual: post-norm is norm(x + f(x))"),
    Mistake(lambda x, f, n, norm_first: f(n(x)) if norm_first else f(x),
            "you left out the residual connection (the '+ x')"),
    Mistake(lambda x, f, n, norm_first: x + n(f(x)),
            "you normalised the sub-layer's output only; post-norm normalises the sum, norm(x + f(x))"),
)


def _residual_inputs(v: View) -> tuple:
    """(x, f, norm, norm_first) in float64, as :data:`_RESIDUAL_MISTAKES` take them."""
    x, sublayer, norm = v.args
    return v.x[0], lambda t: f64(sublayer(t)), lambda t: f64(norm(t)), v.kwargs["norm_first"]


_RESIDUAL = Check(
    reference=lambda v: _block(*_residual_inputs(v)),
    outputs=(Out("output", lambda v: "x + f(norm(x))" if v.kwargs["norm_first"] else "norm(x + f(x))", atol=1e-4,
                 rtol=1e-3),),
    mistakes=mistakes_on(_RESIDUAL_MISTAKES, _residual_inputs),
    matches=close_f64,
)


# --- part 4: AddAndNorm ------------------------------------------------------------------------------
def _add_and_norm_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, shape: tuple[int, ...], norm_first: bool, dropout: float = 0.1, mode: str = "eval") -> Case:
        d = shape[-1]
        sublayer = (torch.ones_like if mode == "train" else  # dropout on a sub-layer of ones is easy to see
                    functools.partial(_tanh_linear, randn(g, d, d, scale=d**-0.5), randn(g, d, scale=0.1)))
        data = {"d_model": d, "dropout": dropout, "norm_first": norm_first, "mode": mode,
                "weight": 1.0 + randn(g, d, scale=0.3), "bias": randn(g, d, scale=0.3)}
        return Case(name, (randn(g, *shape), sublayer), data=data)

    return [
        case("post-norm, evaluation mode, d_model 8", (2, 5, 8), False),
        case("pre-norm, evaluation mode, d_model 16", (3, 4, 16), True),
        case("post-norm, dropout 0.3, evaluation mode: dropout is off", (2, 3, 8), False, dropout=0.3),
        case("pre-norm in training mode, dropout 0.25: dropout acts on the sub-layer's output", (8, 50, 64), True,
             dropout=0.25, mode="train"),
        case("post-norm in training mode, dropout 0.5: two calls differ", (2, 5, 8), False, dropout=0.5,
             mode="train_twice"),
    ]


def _run_add_and_norm(obj: Any, case: Case) -> Any:
    data = case.data
    (x, sublayer), _ = case.fresh_args()
    module = obj(data["d_model"], dropout=data["dropout"], norm_first=data["norm_first"])
    parameters = {name: list(p.shape) for name, p in module.named_parameters() if p.requires_grad}
    norm = getattr(module, "norm", None)
    if not all(isinstance(getattr(norm, name, None), torch.Tensor) for name in ("weight", "bias")):
        return {"parameters": parameters, "missing_norm": True}
    result = {"parameters": parameters, "initial": (norm.weight.detach().clone(), norm.bias.detach().clone())}
    with torch.no_grad():
        norm.weight.copy_(data["weight"])
        norm.bias.copy_(data["bias"])
        module.train(data["mode"] != "eval")
        result["output"] = module(x, sublayer)
        if data["mode"] != "eval":
            result["again"] = module(x, sublayer)
    return result


def _add_and_norm_parameters(output: dict[str, Any], d: int) -> Finding | None:
    shapes = output["parameters"]
    if sorted(map(tuple, shapes.values())) != [(d,), (d,)]:
        return Finding(f"AddAndNorm(d_model={d}) should own exactly two learnable parameters of shape ({d},), the "
                       f"LayerNorm's gain and bias; yours has {shapes or 'none'} (are they nn.Parameters, created in "
                       "__init__?)", FailureKind.TYPE)
    weight, bias = output["initial"]
    if not (torch.equal(f64(weight), torch.ones(d, dtype=torch.float64))
            and torch.equal(f64(bias), torch.zeros(d, dtype=torch.float64))):
        return Finding("a new LayerNorm starts with gain 1 and bias 0 (it is the identity map after normalising)",
                       FailureKind.PROPERTY)
    return None


def _add_and_norm_eval(case: Case, out: torch.Tensor) -> str | None:
    """Dropout is off: the output must be the block in the asked norm order."""
    x, f, norm_first = f64(case.args[0]), lambda t: f64(case.args[1](t)), case.data["norm_first"]
    norm = functools.partial(_affine_norm, case.data["weight"].double(), case.data["bias"].double())
    expected, other = _block(x, f, norm, norm_first), _block(x, f, norm, not norm_first)
    if close_f64(out, expected):
        return None
    if close_f64(out, other):
        return Finding(f"your module computes the {'post' if norm_first else 'pre'}-norm order, but "
                       f"norm_first={norm_first}", FailureKind.KNOWN_MISTAKE)
    return close_problem(out, expected, "your output (evaluation mode: dropout off)",
                         "x + sublayer(norm(x))" if norm_first else "norm(x + sublayer(x))", atol=1e-4, rtol=1e-3)


def _add_and_norm_train(case: Case, out: torch.Tensor) -> str | None:
    """Pre-norm with a sub-layer of ones: out - x is Dropout(ones), zero where dropped and 1/(1 - p) elsewhere."""
    out, x, p = f64(out), case.args[0], case.data["dropout"]
    change = out - f64(x)
    kept = change.abs() > 1e-6
    dropped, tolerance = 1.0 - float(kept.double().mean()), _drop_tolerance(p, x.numel())
    if abs(float((out == 0).double().mean()) - p) <= tolerance:
        return Finding("your dropout zeroes whole entries of x + f(x): apply it to the sub-layer's output only, "
                       "before the residual add, so that x always passes through", FailureKind.KNOWN_MISTAKE)
    if abs(dropped) < tolerance:
        return Finding("in training mode your module applies no dropout to the sub-layer's output",
                       FailureKind.KNOWN_MISTAKE)
    if abs(dropped - p) > tolerance:
        return Finding(f"with a sub-layer that returns ones, about {fmt(100 * p)}% of out - x should be 0 (dropped), "
                       f"but {fmt(100 * dropped)}% are; apply dropout to the sub-layer's output only",
                       FailureKind.PROPERTY)
    scale = 1.0 / (1.0 - p)
    if not torch.allclose(change[kept], torch.full_like(change[kept], scale), rtol=1e-4, atol=1e-5):
        return Finding(f"the sub-layer's surviving outputs (ones) should arrive as 1/(1 - p) = {fmt(scale)} in "
                       "out - x; apply dropout to the sub-layer's output, before the residual add",
                       FailureKind.PROPERTY)
    return None


def _verify_add_and_norm(case: Case, output: Any) -> str | None:
    d, mode = case.data["d_model"], case.data["mode"]
    if isinstance(output, dict) and output.get("missing_norm"):
        return Finding("AddAndNorm needs its LayerNorm as self.norm, with learnable weight and bias parameters of "
                       f"shape ({d},), e.g. nn.LayerNorm(d_model)", FailureKind.TYPE)
    if not isinstance(output, dict) or "output" not in output:
        return Finding(f"expected your module to return a tensor, got {type(output).__name__}", FailureKind.TYPE)
    out = output["output"]
    if problem := (tensor_problem(out, "your output", case.args[0].shape) or finite_problem(out, "your output")
                   or _add_and_norm_parameters(output, d)):
        return problem
    if mode == "eval":
        return _add_and_norm_eval(case, out)
    if mode == "train":
        return _add_and_norm_train(case, out)
    again = output.get("again")  # "train_twice": dropout must draw a new mask on every call
    if isinstance(again, torch.Tensor) and torch.equal(again, out):
        return Finding("in training mode two calls gave the same output: is dropout (with module.train()) applied?",
                       FailureKind.PROPERTY)
    return None


EXERCISE = with_texts(Exercise(  # title, summaries and hints: ex08.toml
    id="ex08", chapters=("08_layernorm_dropout_residuals",), preamble=PREAMBLE,
    parts=(
        Part("layer_norm", points=2, make_cases=_layer_norm_cases, verify=_LAYER_NORM),
        Part("dropout", points=2, make_cases=_dropout_cases, verify=verify_dropout, run=run_dropout),
        Part("residual_sublayer", points=2, make_cases=_residual_cases, verify=_RESIDUAL),
        Part("add_and_norm", function="AddAndNorm", points=3, make_cases=_add_and_norm_cases,
             verify=_verify_add_and_norm, run=_run_add_and_norm),
    ),
))
