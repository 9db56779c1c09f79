"""Exercise 05, scaling and masking: the checks behind ``exercises/ex05_scaling_and_masking.ipynb``.

With boolean masks (True = may attend) the learner writes scaled scores, a masked softmax (zero weights, never
NaN, for a query with no allowed key), masked scaled dot-product attention, causal self-attention and causal
self-attention over a padded batch. References: the float64 softmax over the allowed keys. Recognised: a missing
or wrong 1/sqrt(d_k), NaN rows, an inverted mask, masking after the softmax, future leakage, ignored padding,
padding masked as queries instead of keys.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch

from attention_course.grading.compare import f64, finite_problem, fmt, matches, row_name, tensor_problem, tuple_problem
from attention_course.grading.declare import Check, Out, View, second_run
from attention_course.grading.findings import FailureKind, Finding
from attention_course.grading.spec import (
    Case,
    Exercise,
    Mistake,
    Part,
    call_function,
    degenerate,
    preamble,
    randn,
    with_texts,
)

PREAMBLE = preamble()


def _random_mask(g: torch.Generator, *shape: int, keep_one: bool = True) -> torch.Tensor:
    """A random boolean mask (True = may attend); with ``keep_one`` every row allows at least one key."""
    mask = torch.rand(*shape, generator=g) > 0.4
    if keep_one:
        rows = mask.reshape(-1, shape[-1])
        first = torch.randint(shape[-1], (rows.shape[0],), generator=g)
        rows[torch.arange(rows.shape[0]), first] = True
    return mask


def _causal(length: int) -> torch.Tensor:
    return torch.ones(length, length, dtype=torch.bool).tril()


def _projections(g: torch.Generator, d_model: int, d_k: int, d_v: int) -> tuple[torch.Tensor, ...]:
    """W_Q, W_K, W_V scaled so that the projections stay near unit size."""
    s = d_model ** -0.5
    return randn(g, d_model, d_k, scale=s), randn(g, d_model, d_k, scale=s), randn(g, d_model, d_v, scale=s)


def _reference_weights(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the allowed keys in float64; rows with no allowed key (0/0 = NaN) become zeros."""
    scores = f64(scores)
    if mask is not None:
        scores = scores.masked_fill(~mask.expand(scores.shape), float("-inf"))
    return torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)


def _scaled_scores(Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    return torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(Q.shape[-1])


def _d_k(v: View) -> int:
    return v.x[0].shape[-1]


# --- part 1: scaled scores ----------------------------------------------------------------------------
def _scores_cases(g: torch.Generator) -> list[Case]:
    return [
        Case("Q (4, 8), K (6, 8)", (randn(g, 4, 8), randn(g, 6, 8))),
        Case("batch and head dimensions: Q (2, 3, 5, 16), K (2, 3, 7, 16)",
             (randn(g, 2, 3, 5, 16), randn(g, 2, 3, 7, 16))),
        Case("unit-variance Q and K with d_k = 256: the scaled scores have variance about 1",
             (randn(g, 64, 256), randn(g, 64, 256)), data={"variance": True}),
        degenerate(Case("d_k = 1", (randn(g, 3, 1), randn(g, 4, 1)))),
    ]


def _raw_scores(v: View) -> torch.Tensor:
    return torch.matmul(v.x[0], v.x[1].transpose(-2, -1))


def _transposed_scores(v: View) -> str | None:
    want = v.want.scores
    transposed = (*want.shape[:-2], want.shape[-1], want.shape[-2])
    if isinstance(v.output, torch.Tensor) and want.shape[-1] != want.shape[-2] and v.output.shape == transposed:
        return (tensor_problem(v.output, "your scores", want.shape)
                + ": one row per query and one column per key (each query's scores against every key form a row)")
    return None


def _variance_note(v: View) -> str:
    return f" (their variance is {fmt(float(f64(v.got.scores).var()))})" if v.data.get("variance") else ""


def _unit_variance(v: View) -> str | None:
    variance = float(f64(v.got.scores).var()) if v.data.get("variance") else 1.0
    if not 0.8 < variance < 1.25:
        return Finding(f"with unit-variance inputs your scores have variance {fmt(variance)}; scaled scores have "
                       "about 1", FailureKind.PROPERTY)
    return None


_SCORES = Check(
    reference=lambda v: _scaled_scores(*v.x),
    outputs=(Out("scores", "Q Kᵀ / sqrt(d_k)"),),
    before=(_transposed_scores,),
    mistakes=(  # with d_k = 1 every scaling gives the same scores: nothing to tell apart
        Mistake(lambda v: _raw_scores(v) if _d_k(v) > 1 else None,
                lambda v: f"your scores are Q Kᵀ without the factor 1/sqrt(d_k){_variance_note(v)}; divide by "
                f"sqrt({_d_k(v)})"),
        Mistake(lambda v: _raw_scores(v) / _d_k(v) if _d_k(v) > 1 else None,
                lambda v: f"your scores are divided by d_k = {_d_k(v)}{_variance_note(v)}; divide by sqrt(d_k) "
                "instead"),
    ),
    matches=functools.partial(matches, atol=1e-4, rtol=1e-4),
    explain=(_unit_variance,),
)


# --- part 2: the masked softmax ------------------------------------------------------------------------
def _masked_softmax_cases(g: torch.Generator) -> list[Case]:
    fully = _random_mask(g, 4, 5)
    fully[2] = False
    left_pad = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    left_pad[1, ..., :2] = False
    return [
        Case("scores (4, 6) with a random mask", (randn(g, 4, 6), _random_mask(g, 4, 6))),
        Case("a causal mask (5, 5) shared by a batch of scores (2, 5, 5)", (randn(g, 2, 5, 5), _causal(5))),
        Case("a padding mask (2, 1, 1, 6) for scores (2, 3, 4, 6)",
             (randn(g, 2, 3, 4, 6), _random_mask(g, 2, 1, 1, 6))),
        Case("row 2 has no allowed key: its weights must be all zero, not NaN", (randn(g, 4, 5), fully),
             data={"empty": True}),
        Case("left padding and a causal mask: the first rows of batch item 1 see nothing",
             (randn(g, 2, 5, 5), _causal(5) & left_pad[:, 0]), data={"empty": True}),
        Case("scores around 1e4 (stability)", (1e4 + randn(g, 3, 6), _random_mask(g, 3, 6))),
        Case("float64 scores keep their dtype", (randn(g, 3, 4, dtype=torch.float64), _random_mask(g, 3, 4))),
        degenerate(Case("mask=None: a plain softmax", (randn(g, 3, 5), None))),
    ]


def _masked_weights(weights: torch.Tensor, scores: torch.Tensor, mask: torch.Tensor | None,
                    what: str = "your weights") -> str | None:
    """The properties of masked weights (of the right shape), each usual mistake with its message: NaN for a query
    with no allowed key, the inverted mask, weight on a blocked key, masking after the softmax, a changed dtype."""
    expected = _reference_weights(scores, mask)
    allowed = torch.ones_like(expected, dtype=torch.bool) if mask is None else mask.expand(expected.shape)
    has_key = allowed.any(dim=-1)
    nan_rows = torch.isnan(weights).any(dim=-1) & ~has_key
    if nan_rows.any():
        return Finding(f"{row_name(nan_rows.nonzero()[0].tolist())} of {what} is NaN: that query has no allowed "
                       "key, and masking with -inf gives 0/0. Fill blocked scores with a finite number "
                       "(the most negative one of their dtype, see torch.finfo) and set such rows to zero",
                       FailureKind.NOT_FINITE)
    problem = finite_problem(weights, what)
    if problem:
        return problem
    w = f64(weights)
    # The inverted mask is told apart only on rows where both it and the mask allow some key.
    both = has_key & (~allowed).any(dim=-1)
    if both.any():
        inverted = torch.allclose(w[both], _reference_weights(scores, ~mask)[both], atol=1e-5)
        if inverted and not torch.allclose(w[both], expected[both], atol=1e-5):
            return Finding(f"{what} follow the inverted mask: in this course True means 'may attend', False means "
                           "blocked", FailureKind.KNOWN_MISTAKE)
    leaked = (w.abs() > 1e-6) & ~allowed
    if leaked.any():
        *row, key = leaked.nonzero()[0].tolist()
        weight = fmt(float(w[(*row, key)]))
        if not has_key[tuple(row)]:
            return (f"{row_name(row)} of {what} has no allowed key, so all its weights must be 0; yours gives "
                    f"{weight} to key {key}")
        return (f"{row_name(row)} of {what} gives weight {weight} to key {key}, which the mask blocks "
                "(False = may not attend)")
    sums = w.sum(dim=-1)
    short = ((sums - 1).abs() > 1e-4) & has_key
    if short.any():
        row = short.nonzero()[0].tolist()
        return (f"{row_name(row)} of {what} sums to {fmt(float(sums[tuple(row)]))} instead of 1: mask the scores "
                "before the softmax (zeroing weights after it leaves rows that do not sum to one)")
    if weights.dtype != scores.dtype:
        return Finding(f"expected {what} to keep the dtype of the scores ({scores.dtype}), got {weights.dtype}",
                       FailureKind.DTYPE)
    return None


_MASKED_SOFTMAX = Check(reference=lambda v: _reference_weights(*v.args),
                        outputs=(Out("weights", "the softmax over the allowed keys", finite=False),),
                        properties=(lambda v: _masked_weights(v.got.weights, *v.args),))


def _masked_attention(scores: Callable[[View], torch.Tensor], mask: Callable[[View], torch.Tensor | None],
                      values: Callable[[View], torch.Tensor], output: str, weights: str, **steps: Any) -> Check:
    """A part returning ``(output, weights)`` of masked attention, the reference built from ``scores``, ``mask`` and
    ``values``. The weights' properties come before the output's finiteness: a NaN weight is the cause to name."""
    def reference(v: View) -> tuple[torch.Tensor, torch.Tensor]:
        w = _reference_weights(scores(v), mask(v))
        return torch.matmul(w, values(v)), w

    def properties(v: View) -> str | None:
        return (_masked_weights(v.got.weights, scores(v).to(v.args[0].dtype), mask(v))
                or finite_problem(v.got.output, "your output"))

    outputs = (Out("output", output, finite=False), Out("weights", weights, finite=False))
    return Check(reference=reference, outputs=outputs, compare=("weights",), properties=(properties,), **steps)


def _zero_rows(v: View, mask: torch.Tensor | None, message: str) -> str | None:
    """The outputs of queries with no allowed key must be all zeros (``message`` names the row)."""
    if mask is None:
        return None
    has_key = mask.expand(*v.want.output.shape[:-1], mask.shape[-1]).any(dim=-1)
    rows = f64(v.got.output)[~has_key]
    if not torch.equal(rows, torch.zeros_like(rows)):
        return message.format(row=row_name((~has_key).nonzero()[0].tolist()))
    return None


# --- part 3: scaled dot-product attention with a mask --------------------------------------------------
def _attention_cases(g: torch.Generator) -> list[Case]:
    def qkv(*lead: int, lq: int, lk: int, d_k: int, d_v: int) -> tuple[torch.Tensor, ...]:
        return randn(g, *lead, lq, d_k), randn(g, *lead, lk, d_k), randn(g, *lead, lk, d_v)

    empty = _random_mask(g, 2, 4, 6)
    empty[1, 3] = False
    return [
        Case("no mask: Q (4, 8), K (6, 8), V (6, 3)", qkv(lq=4, lk=6, d_k=8, d_v=3), {"mask": None}),
        Case("d_k = 64: the scores need the factor 1/sqrt(d_k)", qkv(lq=5, lk=5, d_k=64, d_v=4), {"mask": None}),
        Case("a causal mask (5, 5) for a batch (2, 5, 8)", qkv(2, lq=5, lk=5, d_k=8, d_v=8), {"mask": _causal(5)}),
        Case("a padding mask (2, 1, 1, 6) for heads: Q (2, 3, 4, 8), K and V (2, 3, 6, 8)",
             qkv(2, 3, lq=4, lk=6, d_k=8, d_v=8), {"mask": _random_mask(g, 2, 1, 1, 6)}),
        Case("a query with no allowed key: zero weights and a zero output", qkv(2, lq=4, lk=6, d_k=4, d_v=5),
             {"mask": empty}),
        Case("gradients stay finite when a query has no allowed key", qkv(2, lq=4, lk=6, d_k=4, d_v=5),
             {"mask": empty}, {"gradients": True}),
    ]


def _run_attention(obj: Any, case: Case) -> Any:
    """The output, or for a gradients case the gradients of ``output.sum()`` with respect to Q, K and V."""
    if not case.data.get("gradients"):
        return call_function(obj, case)
    args, kwargs = case.fresh_args()
    inputs = [t.clone().requires_grad_(True) for t in args]
    output, _ = obj(*inputs, **kwargs)
    output.sum().backward()
    return tuple(None if t.grad is None else t.grad.detach() for t in inputs)


def _gradients(output: Any) -> str | None:
    if not isinstance(output, tuple) or len(output) != 3:
        return "the gradients could not be computed: return (output, weights) with output a tensor"
    for name, grad in zip(("query", "key", "value"), output):
        if grad is None:
            return f"no gradient reached the {name}: compute the output from Q, K and V with torch operations"
        problem = finite_problem(grad, f"the gradient of the {name}")
        if problem:
            return problem + ": a fully masked row must not produce NaN anywhere, even in the backward pass"
    return None


_ATTENTION = _masked_attention(
    lambda v: _scaled_scores(*v.x[:2]), lambda v: v.kwargs["mask"], lambda v: v.x[2],
    "F.scaled_dot_product_attention", "the softmax over the allowed keys",
    mistakes=(Mistake(lambda v: torch.softmax(_scaled_scores(*v.x[:2]) * math.sqrt(_d_k(v)), dim=-1)
                      if v.kwargs["mask"] is None else None,
                      lambda v: f"your weights are softmax(Q Kᵀ) without the factor 1/sqrt(d_k) (here d_k = {_d_k(v)})",
                      on="weights"),),
    explain=(lambda v: _zero_rows(v, v.kwargs["mask"], "the output of {row} (a query with no allowed key) must be "
                                  "all zeros"),),
)


def _verify_attention(case: Case, output: Any) -> str | None:
    return _gradients(output) if case.data.get("gradients") else _ATTENTION(case, output)


# --- part 4: causal self-attention ---------------------------------------------------------------------
def _causal_cases(g: torch.Generator) -> list[Case]:
    return [
        Case("X (5, 6), d_k = 4, d_v = 3", (randn(g, 5, 6), *_projections(g, 6, 4, 3))),
        Case("a batch X (2, 4, 6)", (randn(g, 2, 4, 6), *_projections(g, 6, 6, 6))),
        degenerate(Case("a single token: it can only attend to itself", (randn(g, 1, 5), *_projections(g, 5, 3, 2)))),
        Case("no leakage: changing tokens 4 and 5 must not change outputs 1 to 3",
             (randn(g, 2, 5, 6), *_projections(g, 6, 4, 3)), data={"future": randn(g, 2, 2, 6)}),
    ]


def _run_twice(obj: Any, case: Case) -> Any:
    """The output; a case with changed ``future`` tokens, or a padded sequence run ``alone``, also returns the
    output of that second run."""
    if "future" not in case.data and "alone" not in case.data:
        return call_function(obj, case)
    (X, *rest), kwargs = case.fresh_args()
    plain = obj(X.clone(), *rest, **kwargs)
    if "future" in case.data:
        changed = X.clone()
        changed[..., 3:, :] = case.data["future"]
        return plain, obj(changed, *rest, **kwargs)
    row, length = case.data["alone"]
    token_ids, pad_id, *weights = rest
    return plain, obj(X[row:row + 1, :length].clone(), token_ids[row:row + 1, :length].clone(), pad_id, *weights,
                      **kwargs)


def _projected(v: View) -> tuple[torch.Tensor, ...]:
    """Q, K, V = X W_Q, X W_K, X W_V (float64) for a case (X, ..., W_Q, W_K, W_V)."""
    return tuple(torch.matmul(v.x[0], W) for W in v.x[-3:])


def _causal_scores(v: View) -> torch.Tensor:
    return _scaled_scores(*_projected(v)[:2])


def _zero_diagonal(v: View) -> str | None:
    weights = v.output[1] if isinstance(v.output, (tuple, list)) and len(v.output) == 2 else None
    if isinstance(weights, torch.Tensor) and weights.shape == v.want.weights.shape and bool(
            (torch.diagonal(f64(weights), dim1=-2, dim2=-1).abs() < 1e-12).all()):
        return "the diagonal of your weights is zero: a token may attend to itself (j = i is allowed)"
    return None


def _first_token(v: View) -> str | None:
    if not torch.allclose(f64(v.got.output)[..., 0, :], _projected(v)[2][..., 0, :], atol=1e-5):
        return "the first token can only attend to itself, so its output must equal its own value x_1 W_V"
    return None


def _no_leakage(v: View, pair: bool = False) -> str | None:
    """The second run changed tokens 4 and 5 (``extra``, a pair when the part returns one): the outputs of
    tokens 1 to 3 must not move."""
    if "future" not in v.data:
        return None
    problem = tuple_problem(v.extra, "output", "weights") if pair else None
    changed = v.extra[0] if pair and not problem else v.extra
    problem = problem or tensor_problem(changed, "your output", v.got.output.shape)
    if problem:
        return problem
    gap = float((f64(changed)[..., :3, :] - f64(v.got.output)[..., :3, :]).abs().max())
    if not gap <= 1e-5:
        return (f"changing tokens 4 and 5 changed the outputs of tokens 1 to 3 by up to {fmt(gap)}: the future "
                "leaks into the past (query i may only attend to keys j <= i)")
    return None


_CAUSAL = _masked_attention(
    _causal_scores, lambda v: _causal(v.x[0].shape[-2]), lambda v: _projected(v)[2], "causal attention weights @ V",
    "the causal softmax",
    unpack=second_run("future", "alone"),
    before=(_zero_diagonal,),
    explain=(_first_token,),
    after=(lambda v: _no_leakage(v, pair=True),),
)


# --- part 5: causal self-attention over a padded batch -------------------------------------------------
def _decoder_cases(g: torch.Generator) -> list[Case]:
    pad = 0
    right = torch.tensor([[4, 7, 2, 9, 5], [3, 8, 6, pad, pad]])
    left = torch.tensor([[pad, pad, 6, 2, 7], [5, 1, 9, 3, 4]])
    return [
        Case("right padding: (2, 5) tokens, d_model 6", (randn(g, 2, 5, 6), right, pad, *_projections(g, 6, 4, 3))),
        Case("left padding: the first queries of sequence 0 see no real token (zero output)",
             (randn(g, 2, 5, 6), left, pad, *_projections(g, 6, 4, 4))),
        Case("padding id 2 (not 0)", (randn(g, 1, 4, 5), torch.tensor([[7, 3, 2, 2]]), 2, *_projections(g, 5, 3, 5))),
        Case("no leakage: changing tokens 4 and 5 must not change outputs 1 to 3",
             (randn(g, 2, 5, 6), right, pad, *_projections(g, 6, 4, 3)), data={"future": randn(g, 2, 2, 6)}),
        Case("padding changes nothing: sequence 1 alone (3 tokens) gives the same 3 outputs",
             (randn(g, 2, 5, 6), right, pad, *_projections(g, 6, 4, 3)), data={"alone": (1, 3)}),
    ]


def _padded_mask(v: View) -> torch.Tensor:
    """(B, L, L): causal and not padding (True = may attend)."""
    token_ids, pad_id = v.args[1], v.args[2]
    return _causal(token_ids.shape[-1]) & (token_ids != pad_id)[:, None, :]


def _padded_reference(v: View, mask: torch.Tensor) -> torch.Tensor:
    return torch.matmul(_reference_weights(_causal_scores(v), mask), _projected(v)[2])


def _alone(v: View) -> str | None:
    if "alone" not in v.data:
        return None
    row, n = v.data["alone"]
    problem = tensor_problem(v.extra, "your output for the sequence alone", (1, n, v.args[-1].shape[1]))
    if problem:
        return problem
    gap = float((f64(v.extra)[0] - f64(v.got.output)[row, :n]).abs().max())
    if not gap <= 1e-5:
        return (f"the real tokens of sequence {row} get outputs that differ by up to {fmt(gap)} from those of the "
                "same sequence without padding: padding keys must be masked")
    return None


_PADDED = Check(
    reference=lambda v: _padded_reference(v, _padded_mask(v)),
    outputs=(Out("output", "causal, padding-masked scaled dot-product attention"),),
    unpack=second_run("future", "alone"),
    mistakes=(Mistake(lambda v: _padded_reference(v, _causal(v.x[0].shape[-2])),
                      "your output ignores the padding: combine the causal mask with the padding mask (AND) so that "
                      "no query attends to a padding key"),
              Mistake(lambda v: _padded_reference(v, _causal(v.x[0].shape[-2]) & (v.args[1] != v.args[2])[:, :, None]),
                      "your padding mask blocks the padding queries (rows) instead of the padding keys (columns): "
                      "shape it (B, 1, L), not (B, L, 1), so that it blocks the same keys for every query"),),
    explain=(lambda v: _zero_rows(v, _padded_mask(v), "the output of {row} must be all zeros: causally it sees only "
                                  "padding keys"), _no_leakage, _alone),
)


EXERCISE = with_texts(Exercise(  # title, summaries and hints: ex05.toml
    id="ex05", chapters=("05_scaling_and_masking",), preamble=PREAMBLE,
    parts=(
        Part("scaled_scores", points=1, make_cases=_scores_cases, verify=_SCORES),
        Part("masked_softmax", points=2, make_cases=_masked_softmax_cases, verify=_MASKED_SOFTMAX),
        Part("scaled_dot_product_attention", points=2, make_cases=_attention_cases, verify=_verify_attention,
             run=_run_attention),
        Part("causal_self_attention", points=1, make_cases=_causal_cases, verify=_CAUSAL, run=_run_twice),
        Part("causal_padded_self_attention", points=2, make_cases=_decoder_cases, verify=_PADDED, run=_run_twice),
    ),
))
