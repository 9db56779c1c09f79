"""Exercise 04, queries, keys and values: the checks behind ``exercises/ex04_queries_keys_values.ipynb``.

The learner writes, one token per row: the projections Q = X W_Q, K = X W_K, V = X W_V (a ValueError when the
shapes disagree), the same from one fused matrix, one query's output step by step, the matrix form, and
cross-attention. References are PyTorch's, in float64. Recognised mistakes: transposed projections or weights,
equal thirds of W_qkv, a missing or wrong 1/sqrt(d_k), the softmax over the queries, queries from the source
(and overflow named for a softmax that does not subtract the largest score).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from attention_course.grading.compare import f64, float32_atol, fmt, fmt_shape, tensor_problem, tuple_problem
from attention_course.grading.declare import Check, Out, View, distribution, mistakes_on, second_run
from attention_course.grading.spec import (
    Case,
    Exercise,
    Mistake,
    Part,
    call_expecting_error,
    degenerate,
    permutation,
    preamble,
    randn,
    with_texts,
)

PREAMBLE = preamble()


def _reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(softmax(q kᵀ / √d_k) v, weights)`` for float64 inputs."""
    weights = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1])), dim=-1)
    return torch.matmul(weights, v), weights


def _weights_atol(q: torch.Tensor, k: torch.Tensor) -> float:
    """Scores of 1e4 are rounded at that scale in float32; a weight moves by less than its score's roundoff."""
    scores = torch.matmul(f64(q), f64(k).transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return float32_atol(scores.abs().max(), factor=1.0)


_WEIGHT_MISTAKES = (
    Mistake(lambda scores, d_k: torch.softmax(scores, dim=-1),
            lambda scores, d_k: f"your weights are softmax(q·k) without the factor 1/sqrt(d_k) (here d_k = {d_k})"),
    Mistake(lambda scores, d_k: torch.softmax(scores / d_k, dim=-1),
            lambda scores, d_k: f"your weights divide the scores by d_k = {d_k}; divide by sqrt(d_k) instead"),
    Mistake(lambda scores, d_k: torch.softmax(scores / math.sqrt(d_k), dim=-2)
            if scores.dim() >= 2 and scores.shape[-1] == scores.shape[-2] > 1 else None,
            "your softmax runs over the queries (dim=-2); each query's weights over the keys must sum to one "
            "(dim=-1)"),
)


def _scores_and_d_k(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The inputs of :data:`_WEIGHT_MISTAKES`: the unscaled scores and d_k."""
    return torch.matmul(q, k.transpose(-2, -1)), q.shape[-1]


# --- part 1: the three projections ---------------------------------------------------------------------
def _projection_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, x_shape: tuple[int, ...], d_k: int, d_v: int, d_k_key: int | None = None,
             w_rows: int | None = None, error: str | None = None) -> Case:
        X, rows = randn(g, *x_shape), w_rows or x_shape[-1]
        return Case(name, (X, randn(g, rows, d_k), randn(g, rows, d_k_key or d_k), randn(g, rows, d_v)),
                    data={"error": error} if error else {})

    return [
        case("X (5, 6), d_k = d_v = 4", (5, 6), 4, 4),
        case("a batch X (2, 5, 6), d_k = 3, d_v = 7 (d_v may differ from d_k)", (2, 5, 6), 3, 7),
        case("a single token X (1, 8), d_k = 2, d_v = 5", (1, 8), 2, 5),
        case("W_Q (6, 4) but W_K (6, 5): must raise ValueError naming 4 and 5", (5, 6), 4, 3, d_k_key=5,
             error="dk"),
        case("X has 6 features but the weights have 8 rows: must raise ValueError naming 6 and 8", (4, 6), 4, 4,
             w_rows=8, error="rows"),
    ]


def _projection_error(v: View) -> tuple[tuple[int, int], str] | None:
    X, W_Q, W_K, _ = v.args
    if v.data.get("error") == "dk":
        return (W_Q.shape[1], W_K.shape[1]), (f"W_Q has {W_Q.shape[1]} columns and W_K has {W_K.shape[1]}: "
                                              "queries and keys must share d_k")
    if v.data.get("error") == "rows":
        return (X.shape[-1], W_Q.shape[0]), f"X has {X.shape[-1]} features but the weights have {W_Q.shape[0]} rows"
    return None


def _transposed(v: View) -> str | None:
    X = v.args[0]
    for name, actual, W in zip("QKV", v.output if isinstance(v.output, (tuple, list)) else (), v.args[1:]):
        if isinstance(actual, torch.Tensor) and tuple(actual.shape) == (*X.shape[:-2], W.shape[1], X.shape[-2]) \
                and actual.shape != getattr(v.want, name).shape:
            return (tensor_problem(actual, f"your {name}", getattr(v.want, name).shape)
                    + f": did you compute (X W_{name})ᵀ or W_{name}ᵀ Xᵀ? Rows are tokens: X @ W_{name}")
    return None


_PROJECTION = Check(reference=lambda v: tuple(torch.matmul(v.x[0], W) for W in v.x[1:]), raises=_projection_error,
                    outputs=tuple(Out(name, f"X @ W_{name}") for name in "QKV"), before=(_transposed,))


# --- part 2: one fused projection, split ---------------------------------------------------------------
def _fused_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, x_shape: tuple[int, ...], d_k: int, d_v: int) -> Case:
        return Case(name, (randn(g, *x_shape), randn(g, x_shape[-1], 2 * d_k + d_v)), {"d_k": d_k})

    return [
        case("X (5, 8), d_k = d_v = 4: W_qkv (8, 12)", (5, 8), 4, 4),
        case("X (4, 6), d_k = 2, d_v = 5: W_qkv (6, 9), not three equal parts", (4, 6), 2, 5),
        case("a batch X (2, 3, 6), d_k = 3, d_v = 1", (2, 3, 6), 3, 1),
        case("d_k = 1, d_v = 6", (3, 4), 1, 6),
    ]


def _split_widths(v: View) -> str | None:
    X, W_qkv = v.args
    d_k = v.kwargs["d_k"]
    d_v = W_qkv.shape[1] - 2 * d_k
    for name, actual, width in zip("QKV", v.output if isinstance(v.output, (tuple, list)) else (), (d_k, d_k, d_v)):
        if isinstance(actual, torch.Tensor) and actual.shape[:-1] == X.shape[:-1] and actual.shape[-1] != width \
                and d_v != d_k:
            return (f"your {name} has {actual.shape[-1]} columns, expected {width}: W_qkv = [W_Q | W_K | W_V] "
                    f"has 2 d_k + d_v = {W_qkv.shape[1]} columns, so split it into sizes "
                    f"[{d_k}, {d_k}, {d_v}] (equal thirds only work when d_v = d_k)")
    return None


def _fused_reference(v: View) -> tuple[torch.Tensor, ...]:
    d_k = v.kwargs["d_k"]
    return tuple(torch.matmul(v.x[0], W) for W in v.x[1].tensor_split([d_k, 2 * d_k], dim=1))


_FUSED = Check(reference=_fused_reference, before=(_split_widths,),
               outputs=tuple(Out(name, f"X @ W_qkv[:, {name} columns]") for name in "QKV"))


# --- part 3: one query, step by step -------------------------------------------------------------------
def _one_query_cases(g: torch.Generator) -> list[Case]:
    same_key = randn(g, 1, 3).expand(4, 3).clone()
    return [
        Case("q (4,), K (5, 4), V (5, 3)", (randn(g, 4), randn(g, 5, 4), randn(g, 5, 3))),
        Case("d_k = 64: the scores need the factor 1/sqrt(d_k)", (randn(g, 64), randn(g, 6, 64), randn(g, 6, 2))),
        degenerate(Case("a single key: its weight is 1 and the output is its value",
             (randn(g, 3), randn(g, 1, 3), randn(g, 1, 4)))),
        degenerate(Case("all keys equal: uniform weights, the output is the mean value",
             (randn(g, 3), same_key, randn(g, 4, 5)), data={"uniform": True})),
        Case("large scores (about 1e4): no overflow", (randn(g, 4, scale=80.0), randn(g, 5, 4, scale=80.0),
                                                       randn(g, 5, 2)), data={"stability": True}),
    ]


def _uniform(v: View) -> str | None:
    if v.data.get("uniform") and not torch.allclose(f64(v.got.output), v.x[2].mean(0), atol=1e-5):
        return "with all keys equal every weight is 1/L, so the output must be the mean of the values"
    return None


_ONE_QUERY = Check(
    reference=lambda v: tuple(t[0] for t in _reference_attention(v.x[0].unsqueeze(0), *v.x[1:])),
    outputs=(Out("output", "sum_j weights[j] * V[j]", by_rows=False),
             Out("weights", "softmax(K q / sqrt(d_k))", by_rows=False, atol=lambda v: _weights_atol(*v.args[:2]))),
    compare=("weights",),
    advice=lambda v: (": exp overflows to infinity for scores above about 88 in float32 (inf / inf = NaN); subtract "
                      "the largest score before exponentiating, as torch.softmax does" if v.data.get("stability")
                      else ""),
    properties=(distribution("weights"), _uniform),
    mistakes=(*mistakes_on(_WEIGHT_MISTAKES, lambda v: _scores_and_d_k(*v.x[:2]), on="weights"),
              Mistake(lambda v: v.x[2].mean(dim=0), "your output is the plain mean of the values: weight each value "
                      "row V[j] by its attention weight and add them up", on="output")),
)


# --- part 4: the matrix form ---------------------------------------------------------------------------
def _matrix_cases(g: torch.Generator) -> list[Case]:
    def qkv(lead: tuple[int, ...], lq: int, lk: int, d_k: int, d_v: int, scale: float = 1.0) -> tuple:
        return (randn(g, *lead, lq, d_k, scale=scale), randn(g, *lead, lk, d_k, scale=scale),
                randn(g, *lead, lk, d_v))

    return [
        Case("Q, K (4, 6), V (4, 3)", qkv((), 4, 4, 6, 3)),
        Case("3 queries, 5 keys: Q (3, 4), K (5, 4), V (5, 2)", qkv((), 3, 5, 4, 2)),
        Case("batch and head dimensions: Q, K, V (2, 3, 5, 8)", qkv((2, 3), 5, 5, 8, 8)),
        Case("d_k = 64: the scores need the factor 1/sqrt(d_k)", qkv((), 5, 5, 64, 4)),
        Case("a single query: Q (1, 4), K (6, 4), V (6, 4)", qkv((), 1, 6, 4, 4)),
        Case("large scores (about 1e4): no overflow", qkv((2,), 3, 4, 4, 3, scale=80.0)),
    ]


def _transposed_weights(v: View) -> str | None:
    w, expected = v.output[1] if isinstance(v.output, (tuple, list)) and len(v.output) == 2 else None, v.want.weights
    if isinstance(w, torch.Tensor) and tuple(w.shape) == (*expected.shape[:-2], *reversed(expected.shape[-2:])) \
            and expected.shape[-1] != expected.shape[-2]:
        return (f"your weights have shape {fmt_shape(w.shape)}, expected {fmt_shape(expected.shape)}: one row "
                "per query and one column per key (each query's scores against every key form a row)")
    return None


_MATRIX = Check(
    reference=lambda v: _reference_attention(*v.x),
    outputs=(Out("output", "F.scaled_dot_product_attention"),
             Out("weights", "softmax(Q Kᵀ / sqrt(d_k))", atol=lambda v: _weights_atol(*v.args[:2]))),
    compare=("weights",),
    before=(_transposed_weights,),
    properties=(distribution("weights"),),
    mistakes=mistakes_on(_WEIGHT_MISTAKES, lambda v: _scores_and_d_k(*v.x[:2]), on="weights"),
)


# --- part 5: cross-attention ---------------------------------------------------------------------------
def _cross_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, lead: tuple[int, ...], lq: int, lk: int, d_q: int, d_kv: int, d_k: int, d_v: int,
             data: dict[str, Any] | None = None, same: bool = False) -> Case:
        X_q = randn(g, *lead, lq, d_q)
        X_kv = X_q.clone() if same else randn(g, *lead, lk, d_kv)
        weights = (randn(g, d_q, d_k, scale=d_q ** -0.5), randn(g, d_kv, d_k, scale=d_kv ** -0.5),
                   randn(g, d_kv, d_v, scale=d_kv ** -0.5))
        return Case(name, (X_q, X_kv, *weights), data=data or {})

    return [
        degenerate(case("self-attention: X_q = X_kv, (5, 6)", (), 5, 5, 6, 6, 4, 4, same=True)),
        case("cross-attention: 3 target queries, 7 source tokens, width 6", (), 3, 7, 6, 6, 4, 5),
        case("decoder width 6, encoder width 10: W_Q (6, 4), W_K (10, 4), W_V (10, 3)", (), 4, 6, 6, 10, 4, 3),
        case("a batch: X_q (2, 5, 8), X_kv (2, 3, 8)", (2,), 5, 3, 8, 8, 8, 8),
        case("reordering the source tokens leaves every output unchanged", (), 4, 6, 5, 5, 3, 3,
             data={"perm_kv": permutation(g, 6)}),
        case("reordering the target tokens reorders the outputs", (), 5, 4, 5, 5, 3, 3,
             data={"perm_q": permutation(g, 5)}),
    ]


def _run_cross(obj: Any, case: Case) -> Any:
    """On a reordering case, also the output with the source (``perm_kv``) or the target (``perm_q``) reordered."""
    (X_q, X_kv, *weights), kwargs = case.fresh_args()
    if "perm_kv" not in case.data and "perm_q" not in case.data:
        return obj(X_q, X_kv, *weights, **kwargs)
    plain = obj(X_q.clone(), X_kv.clone(), *weights, **kwargs)
    if "perm_kv" in case.data:
        return plain, obj(X_q.clone(), X_kv[case.data["perm_kv"]], *weights, **kwargs)
    return plain, obj(X_q[case.data["perm_q"]], X_kv.clone(), *weights, **kwargs)


def _projections(v: View) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    X_q, X_kv, W_Q, W_K, W_V = v.x
    return torch.matmul(X_q, W_Q), torch.matmul(X_kv, W_K), torch.matmul(X_kv, W_V)


def _roles(v: View) -> str | None:
    lq, lk = v.args[0].shape[-2], v.args[1].shape[-2]
    out = v.output[0] if isinstance(v.output, (tuple, list)) and v.output else None
    if isinstance(out, torch.Tensor) and lq != lk and out.dim() >= 2 and out.shape[-2] == lk:
        return (f"your output has {lk} rows, one per source token; cross-attention gives one output per "
                f"query, and the queries come from X_q ({lq} rows: the target, decoder side)")
    return None


def _reordered(v: View) -> str | None:
    if v.extra is None:
        return None
    problem = tuple_problem(v.extra, "output", "weights") or tensor_problem(v.extra[0], "your output",
                                                                             v.want.output.shape)
    if problem:
        return problem
    perm = v.data.get("perm_q")  # reordered targets reorder the output; reordered sources leave it as it is
    expected = f64(v.got.output) if perm is None else f64(v.got.output)[perm]
    gap = float((f64(v.extra[0]) - expected).abs().max())
    if gap <= 1e-4:
        return None
    if perm is None:
        return (f"reordering the source tokens (keys and values together) changed your output by up to "
                f"{fmt(gap)}; attention over the source is a weighted average of a set, so it must not")
    return (f"reordering the target tokens by {perm.tolist()} should reorder your output rows the same "
            f"way, but they differ by up to {fmt(gap)}")


_CROSS = Check(
    reference=lambda v: _reference_attention(*_projections(v)),
    outputs=(Out("output", "weights @ (X_kv W_V)"), Out("weights", "softmax((X_q W_Q)(X_kv W_K)ᵀ / sqrt(d_k))")),
    compare=("weights",),
    unpack=second_run("perm_kv", "perm_q", message="expected your function to return a tuple (output, weights)"),
    before=(_roles,),
    properties=(distribution("weights"),),
    mistakes=mistakes_on(_WEIGHT_MISTAKES, lambda v: _scores_and_d_k(*_projections(v)[:2]), on="weights"),
    after=(_reordered,),
)


EXERCISE = with_texts(Exercise(  # title, summaries and hints: ex04.toml
    id="ex04", chapters=("04_queries_keys_values",), preamble=PREAMBLE,
    parts=(
        Part("project_qkv", points=1, make_cases=_projection_cases, verify=_PROJECTION, run=call_expecting_error),
        Part("split_fused_projection", points=1, make_cases=_fused_cases, verify=_FUSED),
        Part("attend_one_query", points=2, make_cases=_one_query_cases, verify=_ONE_QUERY),
        Part("attention_matrix_form", points=2, make_cases=_matrix_cases, verify=_MATRIX),
        Part("cross_attention", points=2, make_cases=_cross_cases, verify=_CROSS, run=_run_cross),
    ),
))
