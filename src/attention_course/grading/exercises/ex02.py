"""Exercise 02, hard and soft attention: the checks behind ``exercises/ex02_hard_and_soft_attention.ipynb``.

The learner writes, one token per row of ``X``: hard (one-hot argmax) weights, soft weights with an inverse
temperature β, attention pooling ``h = a X``, self-attention without projections and a permutation-equivariance
gap. References are PyTorch's functions in float64; recognised mistakes: argmax indices instead of one-hot rows,
β ignored or dividing the scores, the pooled output transposed, (weights, output) returned swapped.
"""

from __future__ import annotations

import itertools
from functools import partial
from typing import Any

import torch

from attention_course.grading.compare import f64, float32_atol, fmt, row_name, scalar_problem, tensor_problem
from attention_course.grading.declare import Check, Out, View, distribution, second_run
from attention_course.grading.findings import FailureKind, Finding
from attention_course.grading.spec import (
    Case,
    Exercise,
    Mistake,
    Part,
    degenerate,
    diagnose,
    pair_problem,
    permutation,
    preamble,
    randn,
    with_texts,
)

PREAMBLE = preamble()


# --- part 1: hard attention weights --------------------------------------------------------------------
def _hard_cases(g: torch.Generator) -> list[Case]:
    ties = randn(g, 4, 6)
    for row in range(4):  # two equal maxima per row, at random keys i < j: the first one must win
        i, j = sorted(torch.randperm(6, generator=g)[:2].tolist())
        ties[row, i] = ties[row, j] = ties[row].max() + 1.0
    return [
        Case("a vector of 6 scores", (randn(g, 6),)),
        Case("scores of shape (4, 7): one row per query", (randn(g, 4, 7),)),
        Case("scores of shape (2, 3, 5): any leading dimensions", (randn(g, 2, 3, 5),)),
        Case("ties: two equal highest scores in a row (the first one wins)", (ties,)),
        Case("all scores negative", (-randn(g, 3, 5).abs() - 1.0,)),
        Case("large scores (about 1e4)", (randn(g, 3, 6, scale=1e4),)),
        Case("a single key per row, shape (3, 1)", (randn(g, 3, 1),)),
    ]


def _verify_hard(case: Case, output: Any) -> str | None:
    """One-hot rows on the first highest score, checked row by row so that the first wrong row is named."""
    scores = case.args[0]
    if isinstance(output, torch.Tensor) and output.shape == scores.shape[:-1] and not output.is_floating_point():
        return Finding(f"expected one-hot weights of shape {tuple(scores.shape)}, got indices of shape "
                       f"{tuple(output.shape)}: turn the argmax index into a one-hot vector",
                       FailureKind.KNOWN_MISTAKE)
    if problem := tensor_problem(output, "your weights", scores.shape):
        return problem
    rows = output.reshape(-1, scores.shape[-1]).to(torch.float64)
    winners = scores.reshape(-1, scores.shape[-1]).argmax(dim=-1).tolist()  # argmax returns the first maximum
    for index, row, best in zip(itertools.product(*map(range, scores.shape[:-1])), rows, winners):
        name = row_name(index) if index else "the weight vector"
        if not bool(((row == 0) | (row == 1)).all()):
            bad = float(row[(row != 0) & (row != 1)][0])
            return Finding(f"{name} of your weights has the entry {fmt(bad)}; hard attention weights are 0 or 1",
                           FailureKind.PROPERTY)
        ones, chosen = int(row.sum()), int(row.argmax())
        if ones != 1:
            return Finding(f"{name} of your weights has {ones} ones; hard attention picks exactly one key",
                           FailureKind.PROPERTY)
        if chosen != best:
            return Finding(f"{name} of your weights picks key {chosen}, but the first highest score is at key {best}",
                           FailureKind.MISMATCH)
    return None


# --- part 2: soft attention weights --------------------------------------------------------------------
def _soft_cases(g: torch.Generator) -> list[Case]:
    return [
        Case("scores (5, 8), beta = 1", (randn(g, 5, 8),), {"beta": 1.0}),
        Case("scores (2, 3, 6), beta = 2.5", (randn(g, 2, 3, 6),), {"beta": 2.5}),
        degenerate(Case("a vector of 7 scores, beta = 0.5", (randn(g, 7),), {"beta": 0.5})),
        Case("beta = 0 gives uniform weights", (randn(g, 4, 5),), {"beta": 0.0}),
        Case("beta = 50 is close to hard attention", (randn(g, 4, 6, scale=3.0),), {"beta": 50.0},
             {"stability": True}),
        Case("scores around +1e4 (overflow test)", (1e4 + randn(g, 3, 5),), {"beta": 1.0}, {"stability": True}),
        Case("scores around -1e4 (underflow test)", (-1e4 + randn(g, 3, 5),), {"beta": 1.0}, {"stability": True}),
        Case("float64 scores keep their dtype", (randn(g, 3, 4, dtype=torch.float64),), {"beta": 1.5}),
    ]


def _advice(v: View) -> str:
    return " (subtract each row's maximum before exponentiating)" if v.data.get("stability") else ""


_SOFT = Check(
    reference=lambda v: torch.softmax(v.x[0] * v.kwargs["beta"], dim=-1),
    outputs=(Out("weights", "softmax(beta * scores)", dtype=lambda v: v.args[0].dtype),),
    advice=_advice,
    properties=(distribution("weights"),),
    mistakes=(Mistake(lambda v: torch.softmax(v.x[0], dim=-1), "your weights ignore beta: multiply the scores by it"),
              Mistake(lambda v: torch.softmax(v.x[0] / v.kwargs["beta"], dim=-1),
                      "your weights divide the scores by beta: multiply them by beta instead")),
)


# --- part 3: attention pooling -------------------------------------------------------------------------
def _pooling_cases(g: torch.Generator) -> list[Case]:
    def soft(*shape: int) -> torch.Tensor:
        return torch.softmax(randn(g, *shape), dim=-1)

    one_hot_keys = torch.tensor([3, 0, 4])
    one_hot = torch.nn.functional.one_hot(one_hot_keys, 5).to(torch.float32)
    return [
        Case("X (5, 3) and one query's weights (1, 5)", (randn(g, 5, 3), soft(1, 5))),
        Case("X (6, 4) and weights (3, 6)", (randn(g, 6, 4), soft(3, 6))),
        Case("a batch: X (2, 5, 3) and weights (2, 4, 5)", (randn(g, 2, 5, 3), soft(2, 4, 5))),
        Case("one-hot weights pick rows of X", (randn(g, 5, 2), one_hot), data={"picks": one_hot_keys}),
        degenerate(Case("uniform weights give the mean of the rows", (randn(g, 4, 3), torch.full((2, 4), 0.25)),
             data={"mean": True})),
    ]


def _pooling_examples(v: View) -> str | None:
    """One-hot weights must copy rows of X, uniform weights average them."""
    got, want = f64(v.got.output), v.want.output
    for query, key in enumerate(v.data.get("picks", torch.tensor([])).tolist()):
        if not torch.allclose(got[query], want[query], atol=1e-5):
            return f"with a one-hot weight on key {key}, output row {query} should equal row {key} of X"
    if v.data.get("mean") and not torch.allclose(got, want, atol=1e-5):
        return "with uniform weights every output row should be the mean of the rows of X"
    return None


def _pooling_transposed(v: View) -> Finding | None:
    """An output of shape (..., d, queries) that is (weights @ X)ᵀ: the product taken the other way round."""
    want, out = v.want.output, v.output
    if isinstance(out, torch.Tensor) and out.is_floating_point() and want.shape[-1] != want.shape[-2] \
            and tuple(out.shape) == (*want.shape[:-2], want.shape[-1], want.shape[-2]) \
            and torch.allclose(f64(out), want.transpose(-2, -1), atol=1e-5, rtol=1e-4):
        return Finding(f"your output is (weights @ X)ᵀ, of shape {tuple(out.shape)}: one row per feature. "
                       f"Keep one row per query: multiply weights (queries, keys) by X (keys, features), giving "
                       f"shape {tuple(want.shape)}", FailureKind.KNOWN_MISTAKE)
    return None


_POOLING = Check(reference=lambda v: torch.matmul(v.x[1], v.x[0]), outputs=(Out("output", "weights @ X"),),
                 before=(_pooling_transposed,),
                 properties=(_pooling_examples,),
                 mistakes=(Mistake(lambda v: v.x[0].mean(dim=-2, keepdim=True).expand(*v.x[1].shape[:-1],
                                                                                      v.x[0].shape[-1]),
                                   "every output row is the plain mean of the rows of X: weight row j of X by "
                                   "the query's weight on key j"),))


# --- part 4: self-attention without projections --------------------------------------------------------
def _self_attention_cases(g: torch.Generator) -> list[Case]:
    permuted = randn(g, 5, 3)
    large = randn(g, 4, 3, scale=100.0)
    # Row 1 is twice row 0, so both rows' largest scores are in the same column: the weights are not symmetric,
    # and a softmax over the queries (columns) differs from the right one on every draw.
    large[1] = 2.0 * large[0]
    return [
        Case("X (4, 3), beta = 1", (randn(g, 4, 3),), {"beta": 1.0}),
        Case("a batch: X (2, 5, 4), beta = 0.5", (randn(g, 2, 5, 4),), {"beta": 0.5}),
        degenerate(Case("beta = 0: every output row is the mean of X", (randn(g, 6, 2),), {"beta": 0.0})),
        Case("large inputs: |x| about 100, scores about 1e4", (large,), {"beta": 1.0},
             {"stability": True}),
        degenerate(Case("a single token, X (1, 5)", (randn(g, 1, 5),), {"beta": 1.0})),
        Case("permuting the rows of X permutes the output", (permuted,), {"beta": 1.0},
             {"perm": permutation(g, 5, inverse_differs=True)}),
    ]


def _run_self_attention(obj: Any, case: Case) -> Any:
    """On the permutation case, also the output on the permuted rows (for the equivariance check)."""
    (X,), kwargs = case.fresh_args()
    if "perm" not in case.data:
        return obj(X, **kwargs)
    return obj(X.clone(), **kwargs), obj(X[case.data["perm"]].clone(), **kwargs)


def _self_attention_reference(v: View) -> tuple[torch.Tensor, torch.Tensor]:
    X = v.x[0]
    weights = torch.softmax(v.kwargs["beta"] * torch.matmul(X, X.transpose(-2, -1)), dim=-1)
    return torch.matmul(weights, X), weights


def _permuted(v: View) -> str | None:
    if v.extra is None:
        return None
    if problem := pair_problem(v.extra, v.want.output.shape, v.want.weights.shape):
        return problem
    perm = v.data["perm"]
    gap = (f64(v.extra[0]) - f64(v.got.output)[perm]).abs().max()
    if not gap <= 1e-4:
        return (f"permuting the rows of X by {perm.tolist()} should permute the output rows the same way, "
                f"but they differ by up to {fmt(float(gap))}")
    return None


def _weights_atol(v: View) -> float:
    """Scores of 1e4 are rounded at that scale; a weight moves by less than its score's roundoff."""
    X = v.x[0]
    return float32_atol((v.kwargs["beta"] * X @ X.transpose(-2, -1)).abs().max(), factor=1.0)


def _swapped_outputs(v: View) -> Finding | None:
    """A pair (weights, output): both tensors right in shape, in the wrong order."""
    out, want = v.output, v.want
    if isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out) \
            and want.output.shape != want.weights.shape and out[0].shape == want.weights.shape \
            and out[1].shape == want.output.shape:
        return Finding("your function returns (weights, output): return them in the order (output, weights)",
                       FailureKind.KNOWN_MISTAKE)
    return None


_SELF_ATTENTION = Check(
    reference=_self_attention_reference,
    before=(_swapped_outputs,),
    outputs=(Out("output", "weights @ X", atol=lambda v: max(1e-4, _weights_atol(v) * float(v.x[0].abs().max()))),
             Out("weights", "softmax(beta * X Xᵀ)", atol=_weights_atol)),
    compare=("weights",),
    unpack=second_run("perm", message="expected your function to return a tuple (output, weights)"),
    advice=_advice,
    properties=(_permuted, distribution("weights")),
    mistakes=(Mistake(lambda v: torch.softmax(v.kwargs["beta"] * v.x[0] @ v.x[0].transpose(-2, -1)
                                              / v.x[0].shape[-1] ** 0.5, dim=-1),
                      "your weights divide the scores by sqrt(d): this exercise's self-attention has no such scale, "
                      "beta is its only one", on="weights"),),
)


# --- part 5: measuring permutation equivariance --------------------------------------------------------
# The maps f handed to the learner's function are module-level functions (or partials) so that cases pickle.
def _self_attention_map(X: torch.Tensor) -> torch.Tensor:
    return torch.softmax(X @ X.transpose(-2, -1), dim=-1) @ X


def _row_wise_map(X: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    return torch.tanh(X @ W)


def _centre_rows(X: torch.Tensor) -> torch.Tensor:
    return X - X.mean(dim=-2, keepdim=True)


def _equivariance_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, f: Any, t: int, d: int) -> Case:
        # Drawn again until the gap taken with the inverse permutation is another number (for an equivariant f
        # both are 0, so there p(i) differs from p⁻¹(i) on every row instead): that mistake fails on every draw.
        while True:
            X, perm = randn(g, t, d), permutation(g, t, everywhere=True)
            right, inverse = _gap(f, X, perm, perm), _gap(f, X, perm, torch.argsort(perm))
            if right < 1e-3 or abs(right - inverse) > 0.05 * (1.0 + right):
                return Case(name, (f, X, perm))

    return [
        case("f = self-attention (equivariant)", _self_attention_map, 5, 3),
        case("f = the same map on every row (equivariant)", partial(_row_wise_map, W=randn(g, 4, 2)), 6, 4),
        case("f = subtract the mean row (equivariant)", _centre_rows, 4, 3),
        case("f = running sum over positions (not equivariant)", partial(torch.cumsum, dim=-2), 5, 2),
        case("f = add a vector per position (not equivariant)", partial(torch.add, other=randn(g, 6, 3)), 6, 3),
    ]


def _gap(f: Any, X: torch.Tensor, perm: torch.Tensor, output_order: torch.Tensor) -> float:
    """The largest difference between f(X[perm]) and f(X) with its rows in ``output_order``."""
    return float((f(X[perm]).to(torch.float64) - f(X).to(torch.float64)[output_order]).abs().max())


def _same_gap(gap: Any, other: float) -> bool:
    return abs(float(gap) - other) <= 1e-4 + 1e-3 * abs(other)


_EQUIVARIANCE_MISTAKES = (  # (f, X, perm) -> a wrong gap
    Mistake(lambda f, X, perm: _gap(f, X, perm, torch.argsort(perm)),
            "your gap reorders f(X) by the inverse permutation: equivariance compares f(X[perm]) with f(X)[perm], "
            "the same perm on both sides"),
    Mistake(lambda f, X, perm: 0.0,
            "your gap is 0, but this f is not permutation equivariant: permute the input on one side, f(X[perm]), "
            "and the output on the other, f(X)[perm] (a side compared with itself always gives 0)"),
)


def _verify_equivariance(case: Case, output: Any) -> str | None:
    f, X, perm = case.args
    expected = _gap(f, X, perm, perm)
    if problem := scalar_problem(output, "your gap"):
        return problem
    gap = float(output)
    if _same_gap(gap, expected):
        return None
    if mistake := diagnose(_EQUIVARIANCE_MISTAKES, gap, f, X, perm, matches=_same_gap, right=expected):
        return mistake
    kind = "is" if expected < 1e-4 else "is not"
    return Finding(f"your gap is {fmt(gap)}, but the largest difference between f(X[perm]) and f(X)[perm] is "
                   f"{fmt(expected)} (this f {kind} permutation equivariant)", FailureKind.MISMATCH)


EXERCISE = with_texts(Exercise(  # title, summaries and hints: ex02.toml
    id="ex02", chapters=("02_hard_and_soft_attention",), preamble=PREAMBLE,
    parts=(
        Part("hard_attention_weights", points=1, make_cases=_hard_cases, verify=_verify_hard),
        Part("soft_attention_weights", points=2, make_cases=_soft_cases, verify=_SOFT),
        Part("attention_pooling", points=1, make_cases=_pooling_cases, verify=_POOLING),
        Part("self_attention_no_projections", points=2, make_cases=_self_attention_cases, verify=_SELF_ATTENTION,
             run=_run_self_attention),
        Part("equivariance_gap", points=2, make_cases=_equivariance_cases, verify=_verify_equivariance),
    ),
))
