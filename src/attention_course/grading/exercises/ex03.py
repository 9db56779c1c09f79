"""Exercise 03, attention as a soft key–value lookup: the checks behind ``exercises/ex03_key_value_store.ipynb``.

The learner writes, one query, key or value per row: a hard lookup, the soft lookup ``softmax(beta · Q Kᵀ) V``,
the additive score ``wᵀ tanh(q W_q + k W_k)`` and the soft lookup's limit as ``beta → ∞`` (tied keys share the
weight). References, in float64: ``F.scaled_dot_product_attention``, the library's ``AdditiveAttention`` with the
learner's matrices, and the definitions. Recognised mistakes: the best key instead of its value, another key's
value, beta ignored or over sqrt(d_k), tanh left out or applied to each term.
"""


from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from attention_course.grading.compare import close_problem, f64, fmt, row_name
from attention_course.grading.declare import Check, Out, View, distribution
from attention_course.grading.findings import FailureKind, Finding
from attention_course.grading.package_view import instructor_side
from attention_course.grading.spec import Case, Exercise, Mistake, Part, degenerate, preamble, randn, with_texts

# The references run in the grader's process only: the sandbox's view of the package lacks them.
AdditiveAttention = instructor_side("attention_course.additive", "AdditiveAttention")

PREAMBLE = preamble()


def _randint(g: torch.Generator, *shape: int, low: int = -2, high: int = 3) -> torch.Tensor:
    """Small integers stored as floats: their dot products are exact, so ties are exact in any order of sums."""
    return torch.randint(low, high, shape, generator=g).to(torch.float32)


def _qkv(g: torch.Generator, m: int, n: int, d_k: int, d_v: int, batch: tuple[int, ...] = (), scale: float = 1.0
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``m`` queries and ``n`` keys of width ``d_k`` (times ``scale``), ``n`` values of width ``d_v``."""
    return (randn(g, *batch, m, d_k, scale=scale), randn(g, *batch, n, d_k, scale=scale), randn(g, *batch, n, d_v))


def _scores(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Reference dot-product scores ``(..., m, n)`` in float64."""
    return torch.matmul(query.to(torch.float64), keys.to(torch.float64).transpose(-2, -1))


# --- part 1: the hard lookup -----------------------------------------------------------------------------
def _far_and_near(inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """``inputs`` with the first query (of each batch item) of length 1, key 0 three times it (score 3) and key 1
    the query plus 1% (score 1.01, and the nearest key by far: distance 0.01): the best score is never key 1's,
    so a lookup by distance, not by score, picks another key on every draw."""
    query, keys, values = inputs
    query = query / query[..., :1, :].norm(dim=-1, keepdim=True)  # the first query has length 1
    keys = keys.clone()
    keys[..., 0, :] = 3.0 * query[..., 0, :]
    keys[..., 1, :] = 1.01 * query[..., 0, :]
    return query, keys, values


def _hard_cases(g: torch.Generator) -> list[Case]:
    tied_queries = _randint(g, 4, 3, low=1, high=3)
    tied_queries[0] = 1.0  # (1, 1, 1): key 0 (equal to it) is the nearest, keys 1 and 4 score highest
    tied_keys = _randint(g, 6, 3, low=-2, high=2)
    tied_keys[1] = tied_keys[4] = 2.0  # equal keys, and the best ones for the positive queries below
    tied_keys[0] = 1.0
    negative_queries, negative_keys = randn(g, 3, 2).abs() + 0.5, -(randn(g, 5, 2).abs() + 0.5)
    # For the first query (3, 0.5): key 0 scores highest (-1.03; the others score below -1.75) but key 1 is
    # nearer (distance^2 13.25 against 15.3, the others' at least 13.25 plus their excess over (0.5, 0.5)).
    negative_queries[0] = torch.tensor([3.0, 0.5])
    negative_keys[0], negative_keys[1] = torch.tensor([-0.01, -2.0]), torch.tensor([-0.5, -0.5])
    return [
        Case("one query (1, 4), 6 keys, values of width 3", _far_and_near(_qkv(g, 1, 6, 4, 3))),
        Case("5 queries, 8 keys (d_k = 3), values of width 5", _far_and_near(_qkv(g, 5, 8, 3, 5))),
        Case("a batch: queries (2, 4, 3), keys (2, 6, 3), values (2, 6, 2)",
             _far_and_near(_qkv(g, 4, 6, 3, 2, batch=(2,)))),
        Case("keys 1 and 4 are equal: on a tie the first key wins", (tied_queries, tied_keys, randn(g, 6, 2))),
        Case("every score negative", (negative_queries, negative_keys, randn(g, 5, 3))),
        degenerate(Case("a single key: every query gets its value", _qkv(g, 3, 1, 4, 6))),
    ]


def _hard_reference(v: View) -> torch.Tensor:
    query, keys, values = v.x
    winners = _scores(query, keys).argmax(dim=-1)  # (..., m): torch.argmax returns the first maximum
    return torch.gather(values, -2, winners.unsqueeze(-1).expand(*winners.shape, values.shape[-1]))


def _hard_rows(v: View) -> str | None:
    """Each output row must be the best key's value; a row that is another key's value says which key."""
    query, keys, values = v.x
    winners, got = _scores(query, keys).argmax(dim=-1), f64(v.got.output)
    for index in itertools.product(*map(range, query.shape[:-1])):  # (batch..., query)
        best = int(winners[index])
        same = [j for j, value in enumerate(values[index[:-1]]) if torch.allclose(got[index], value, atol=1e-6)]
        if best in same:
            continue
        if same:
            return Finding(f"{row_name(index)} of your output is the value of key {same[0]}, but the highest score "
                           f"(the first one, on a tie) is at key {best}", FailureKind.KNOWN_MISTAKE)
        return Finding(f"{row_name(index)} of your output is not one of the value rows: a hard lookup returns the "
                       f"value of the best key (key {best}) unchanged", FailureKind.MISMATCH)
    return None


def _returned_keys(v: View) -> Finding | None:
    """Output rows of the keys' width d_k (not the values' d_v) that are the best keys themselves."""
    query, keys, values = v.x
    out = v.output
    if not isinstance(out, torch.Tensor) or not out.is_floating_point() or keys.shape[-1] == values.shape[-1] \
            or tuple(out.shape) != (*v.want.output.shape[:-1], keys.shape[-1]):
        return None
    winners = _scores(query, keys).argmax(dim=-1)
    best_keys = torch.gather(keys, -2, winners.unsqueeze(-1).expand(*winners.shape, keys.shape[-1]))
    if not torch.allclose(f64(out), best_keys, atol=1e-5, rtol=1e-4):
        return None
    return Finding(f"your output rows are the best keys (width d_k = {keys.shape[-1]}), not their values (width "
                   f"{values.shape[-1]}): the keys only decide which row to pick; return the value stored under "
                   "the best key", FailureKind.KNOWN_MISTAKE)


_HARD = Check(reference=_hard_reference, outputs=(Out("output"),), before=(_returned_keys,), after=(_hard_rows,))


# --- part 2: the soft lookup -----------------------------------------------------------------------------
def _near_pair(inputs: tuple[torch.Tensor, ...], gap: float = 0.05) -> tuple[torch.Tensor, ...]:
    """``inputs`` with the first query (of each batch item) of length 1, key 0 scoring 6 with it and key 1 scoring
    6 + ``gap``: the best two keys (the other keys are N(0, 1), so their scores are N(0, 1) too and exceed 6 with
    probability 1e-9), a narrow gap apart. With beta = 40 a scale of 1/sqrt(d_k) on top moves their weights by
    more than 0.1, and exp(40 * 6) overflows: the mistakes a near-hard softmax exposes show on every draw."""
    query, keys, values = inputs
    query = query.clone()
    query[..., 0, :] = query[..., 0, :] / query[..., 0, :].norm(dim=-1, keepdim=True)
    keys = keys.clone()
    keys[..., 0, :] = 6.0 * query[..., 0, :]
    keys[..., 1, :] = (6.0 + gap) * query[..., 0, :]
    return query, keys, values


def _soft_cases(g: torch.Generator) -> list[Case]:
    return [
        Case("3 queries, 5 keys (d_k = 4), values of width 2, beta = 1", _qkv(g, 3, 5, 4, 2), {"beta": 1.0}),
        Case("d_k = 16, beta = 1 (no 1/sqrt(d_k) here: beta is the only scale)", _qkv(g, 2, 6, 16, 3, scale=0.4),
             {"beta": 1.0}),
        Case("a batch: queries (2, 3, 4), keys (2, 7, 4), values (2, 7, 5), beta = 0.5",
             _qkv(g, 3, 7, 4, 5, batch=(2,)), {"beta": 0.5}),
        degenerate(Case("beta = 0: every query gets the mean of the values", _qkv(g, 2, 4, 3, 2), {"beta": 0.0})),
        Case("beta = 40: close to the hard lookup", _near_pair(_qkv(g, 3, 6, 3, 4)), {"beta": 40.0},
             {"stability": True}),
        Case("scores around 1e4 (overflow test)", _qkv(g, 2, 5, 2, 3, scale=100.0), {"beta": 1.0},
             {"stability": True}),
        degenerate(Case("a single key", _qkv(g, 3, 1, 4, 2), {"beta": 2.0})),
    ]


def _soft_reference(v: View) -> tuple[torch.Tensor, torch.Tensor]:
    query, keys, values = v.x
    beta = v.kwargs["beta"]
    return (F.scaled_dot_product_attention(query, keys, values, scale=beta),
            torch.softmax(beta * _scores(query, keys), dim=-1))


def _uniform(v: View) -> str | None:
    mean = v.x[2].mean(dim=-2, keepdim=True).expand_as(v.want.output)
    if v.kwargs["beta"] == 0.0 and not torch.allclose(f64(v.got.output), mean, atol=1e-5):
        return "with beta = 0 every weight is 1/n, so every output row should be the mean of the value rows"
    return None


_SOFT = Check(
    reference=_soft_reference,
    outputs=(Out("output", "F.scaled_dot_product_attention(query, keys, values, scale=beta)", atol=1e-4),
             Out("weights", "softmax(beta * query @ keysᵀ)")),
    compare=("weights",),
    advice=lambda v: " (subtract each row's maximum score before exponentiating)" if v.data.get("stability") else "",
    properties=(distribution("weights"), _uniform),
    mistakes=(
        Mistake(lambda v: torch.softmax(_scores(*v.x[:2]), dim=-1),
                "your weights ignore beta: multiply the scores by beta before the softmax", on="weights"),
        Mistake(lambda v: torch.softmax(v.kwargs["beta"] * _scores(*v.x[:2]) / v.x[0].shape[-1] ** 0.5, dim=-1),
                "your weights divide the scores by sqrt(d_k): in this exercise beta is the only scale", on="weights"),
    ),
)


# --- part 3: the additive score --------------------------------------------------------------------------
def _additive_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, batch: tuple[int, ...], m: int, n: int, d_q: int, d_k: int, a: int, scale: float = 1.0):
        return Case(name, (randn(g, *batch, m, d_q, scale=scale), randn(g, *batch, n, d_k, scale=scale),
                           randn(g, d_q, a, scale=0.7), randn(g, d_k, a, scale=0.7), randn(g, a)))

    return [
        case("3 queries and 5 keys of the same size 4, a = 6", (), 3, 5, 4, 4, 6),
        case("queries of size 3, keys of size 5 (d_q != d_k), a = 4", (), 2, 6, 3, 5, 4),
        case("a batch: queries (2, 4, 3), keys (2, 5, 2), a = 8", (2,), 4, 5, 3, 2, 8),
        case("one query, one key", (), 1, 1, 2, 3, 5),
        case("large inputs: tanh saturates, so |score| <= sum |w|", (), 3, 4, 2, 2, 5, scale=50.0),
    ]


def _additive_reference(v: View) -> torch.Tensor:
    query, keys, W_q, W_k, w = v.x
    module = AdditiveAttention(W_q.shape[0], W_k.shape[0], W_q.shape[1]).to(torch.float64)
    with torch.no_grad():  # nn.Linear stores Wᵀ: (out, in)
        module.w_q.weight.copy_(W_q.T)
        module.w_k.weight.copy_(W_k.T)
        module.w.weight.copy_(w.unsqueeze(0))
        return module.score(query, keys)  # (..., m, n)


def _additive_variant(v: View, hidden: Callable[..., torch.Tensor]) -> torch.Tensor:
    """The scores with ``hidden(q W_q, k W_k)`` in place of ``tanh(q W_q + k W_k)``."""
    query, keys, W_q, W_k, w = v.x
    return hidden((query @ W_q).unsqueeze(-2), (keys @ W_k).unsqueeze(-3)) @ w


def _bounded(v: View) -> str | None:
    bound, largest = float(v.x[4].abs().sum()), float(f64(v.got.scores).abs().max())
    if largest > bound * (1 + 1e-5) + 1e-5:
        return (f"your scores reach {fmt(largest)}, but w^T tanh(...) can never exceed sum |w| = {fmt(bound)} "
                "in size: apply tanh to q W_q + k W_k before multiplying by w")
    return None


_ADDITIVE = Check(
    reference=_additive_reference,
    outputs=(Out("scores", "w^T tanh(q W_q + k W_k) (attention_course.additive.AdditiveAttention)", atol=1e-4),),
    properties=(_bounded,),
    mistakes=(Mistake(lambda v: _additive_variant(v, lambda q, k: q + k),
                      "your scores leave out the tanh: apply it to q W_q + k W_k before multiplying by w"),
              Mistake(lambda v: _additive_variant(v, lambda q, k: torch.tanh(q) + torch.tanh(k)),
                      "your scores apply tanh to q W_q and to k W_k apart: add them first, then apply tanh")),
)


# --- part 4: the limit beta -> infinity ------------------------------------------------------------------
def _limit_cases(g: torch.Generator) -> list[Case]:
    duplicated = _randint(g, 5, 2, low=-2, high=3)
    duplicated[0] = duplicated[3] = 3.0  # two equal keys, the best for every query pointing up and right
    base = randn(g, 3, dtype=torch.float64).abs() + 0.5
    others = 0.2 * randn(g, 2, 3, dtype=torch.float64).abs()
    # Keys 1 and 2 point the same way and key 2 is longer by one part in 1e9: the limit is one-hot on key 2.
    near_keys = torch.stack([others[0], base, base * (1 + 1e-9), others[1]])
    many_ties = (_randint(g, 2, 3, 2), _randint(g, 2, 4, 2), randn(g, 2, 4, 3))
    many_ties[0][:, 0] = 1.0  # the first query (1, 1) of each batch item: keys 1 and 2, (2, 2), tie for the best
    many_ties[1][:, 1:3] = 2.0
    return [
        Case("4 queries, 6 keys: unique best keys", _near_pair(_qkv(g, 4, 6, 3, 2), gap=1e-3)),
        Case("keys 0 and 3 are equal: tied best keys share the weight",
             (_randint(g, 6, 2, low=0, high=4), duplicated, randn(g, 5, 3)), data={"ties": True}),
        Case("every key equal: the limit is the mean of the values",
             (_randint(g, 2, 2), _randint(g, 1, 2).expand(4, 2).clone(), randn(g, 4, 3)), data={"ties": True}),
        Case("a near tie: key 2 scores higher than key 1 by one part in 1e9 (float64)",
             (base.unsqueeze(0), near_keys, randn(g, 4, 2, dtype=torch.float64)), data={"near": True}),
        Case("a batch: queries (2, 3, 2), keys (2, 4, 2) of small integers (many ties)",
             many_ties, data={"ties": True}),
        Case("scores around 1e4", _qkv(g, 3, 5, 2, 2, scale=100.0)),
    ]


def _limit_reference(v: View) -> tuple[torch.Tensor, torch.Tensor]:
    query, keys, values = v.x
    scores = _scores(query, keys)
    best = scores == scores.amax(dim=-1, keepdim=True)  # (..., m, n): every key tied for the highest score
    weights = best.to(torch.float64) / best.sum(dim=-1, keepdim=True)
    return torch.matmul(weights, values), weights


def _ties(v: View) -> str | None:
    """Keys tied for a row's highest score must share its weight equally."""
    want, got = v.want.weights, f64(v.got.weights)
    for index in ((want > 0).sum(dim=-1) > 1).nonzero().tolist():
        row, shared = got[tuple(index)], want[tuple(index)] > 0
        if not torch.allclose(row, want[tuple(index)], atol=1e-6):
            tied = shared.nonzero().flatten().tolist()
            return (f"in {row_name(index)} keys {tied} are tied for the highest score, so each should get "
                    f"weight 1/{len(tied)} = {fmt(1 / len(tied))}; yours gives them "
                    f"{[round(float(row[k]), 4) for k in tied]}")
    return None


def _near_tie(v: View) -> str | None:
    problem = v.data.get("near") and close_problem(v.got.weights, v.want.weights, "your weights", _LIMIT, atol=1e-6,
                                                   rtol=0.0)
    return problem and problem + ("; keys 1 and 2 are not tied: however small the gap, the higher score takes all "
                                  "the weight in the limit")


_LIMIT = "the limit of softmax(beta * scores) as beta grows"
_LIMIT_CHECK = Check(
    reference=_limit_reference,
    outputs=(Out("output", "limit_weights @ values", atol=1e-4), Out("weights", _LIMIT, atol=1e-6, rtol=0.0)),
    compare=("weights",),
    properties=(distribution("weights"), _ties, _near_tie),
)


EXERCISE = with_texts(Exercise(  # title, summaries and hints: ex03.toml
    id="ex03", chapters=("03_key_value_store",), preamble=PREAMBLE,
    parts=(
        Part("hard_lookup", points=1, make_cases=_hard_cases, verify=_HARD),
        Part("soft_lookup", points=2, make_cases=_soft_cases, verify=_SOFT),
        Part("additive_scores", points=2, make_cases=_additive_cases, verify=_ADDITIVE),
        Part("limit_lookup", points=2, make_cases=_limit_cases, verify=_LIMIT_CHECK),
    ),
))
