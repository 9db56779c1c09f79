"""Exercise 15, attention at inference scale: the checks behind ``exercises/ex15_attention_at_inference_scale.ipynb``.

The learner writes grouped-query attention, the causal sliding-window mask and one tile of FlashAttention's
backward pass, checked in float64 against ``F.scaled_dot_product_attention(..., enable_gqa=True)``, the mask's
definition ``0 <= i - j < w`` and the backward formulas (themselves checked against autograd on a one-tile case).
Mistakes recognised: ``repeat`` for ``repeat_interleave``, no ``1/sqrt(d)``, the mask ignored, a window one off,
symmetric or complemented, weights normalised within the tile, no ``D``, no scale on ``dQ`` and ``dK``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attention_course.grading.declare import Check, Out, View
from attention_course.grading.findings import FailureKind, Finding
from attention_course.grading.spec import Case, Exercise, Mistake, Part, degenerate, preamble, randn, with_texts

PREAMBLE = preamble()


# --- part 1: grouped-query attention ------------------------------------------------------------------------
def _gqa_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, batch: int, q_heads: int, kv_heads: int, q_len: int, k_len: int, d: int,
             mask: torch.Tensor | None = None) -> Case:
        args = tuple(randn(g, batch, h, n, d) for h, n in ((q_heads, q_len), (kv_heads, k_len), (kv_heads, k_len)))
        # Only a masked case with groups of several heads over several KV heads tells the known mistakes from
        # the answer: the others must pass for full marks but earn no credit on their own.
        credit = mask is not None and 1 < kv_heads < q_heads
        return Case(name, args, {} if mask is None else {"mask": mask}, credit=credit)

    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    padding = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    padding[1, ..., 5:] = False  # the second sequence's last two keys are padding
    return [
        case("4 query heads, 2 KV heads, batch 2, 5 queries and 5 keys, d = 8", 2, 4, 2, 5, 5, 8),
        case("8 query heads, 2 KV heads (groups of 4), 3 queries, 6 keys", 1, 8, 2, 3, 6, 4),
        case("6 query heads, 3 KV heads, causal mask (6, 6)", 2, 6, 3, 6, 6, 8, causal),
        case("4 query heads, 2 KV heads, padding mask (2, 1, 1, 7)", 2, 4, 2, 4, 7, 4, padding),
        case("8 query heads, 4 KV heads, causal mask (5, 5)", 1, 8, 4, 5, 5, 8, causal[:5, :5]),
        case("multi-query: 4 query heads, 1 KV head", 2, 4, 1, 5, 5, 8),
        case("multi-head: 3 query heads, 3 KV heads", 1, 3, 3, 4, 4, 8),
    ]


def _by_hand(v: View, interleave: bool = True, scaled: bool = True, masked: bool = True) -> torch.Tensor:
    """Grouped-query attention written out; the flags give the known mistakes (``repeat`` orders the KV heads
    0, 1, 0, 1, ... instead of 0, 0, 1, 1, ...)."""
    query, key, value = v.x
    group = query.size(1) // key.size(1)
    key, value = (t.repeat_interleave(group, 1) if interleave else t.repeat(1, group, 1, 1) for t in (key, value))
    scores = query @ key.transpose(-2, -1) * (query.size(-1) ** -0.5 if scaled else 1.0)
    if masked and "mask" in v.kwargs:
        scores = scores.masked_fill(~v.kwargs["mask"], -math.inf)
    return torch.softmax(scores, dim=-1) @ value


_GQA = Check(
    reference=lambda v: F.scaled_dot_product_attention(*v.x, attn_mask=v.kwargs.get("mask"), enable_gqa=True),
    outputs=(Out("output", "F.scaled_dot_product_attention(..., enable_gqa=True)"),),
    mistakes=(Mistake(lambda v: _by_hand(v, interleave=False),
                      "your query heads read the wrong key/value heads: groups are consecutive, query head h reads KV "
                      "head h // G (copy each KV head G times in a row, as repeat_interleave does; repeat gives the "
                      "order 0, 1, 0, 1, ...)"),
              Mistake(lambda v: _by_hand(v, scaled=False), "divide the scores by sqrt(d)"),
              Mistake(lambda v: _by_hand(v, masked=False) if "mask" in v.kwargs else None,
                      "your output ignores the mask: masked keys (False) must get zero weight")),
)


# --- part 2: the sliding-window mask ------------------------------------------------------------------------
def _window_cases(g: torch.Generator) -> list[Case]:
    # a decoding step at a random position at least the window (4) in: key t - 4, one past the window, exists, so a
    # one-too-wide window shows on every draw (t = 3 hid it)
    t = 4 + int(torch.randint(0, 20, (1,), generator=g))
    r = 6 + int(torch.randint(0, 30, (1,), generator=g))  # a rolling cache of 5 positions, far into a sequence
    square = torch.arange(6)
    return [
        Case("square: positions 0..5, window 3", (square, square, 3)),
        Case("one query at position t (a decoding step), keys 0..t, window 4",
             (torch.tensor([t]), torch.arange(t + 1), 4)),
        Case("3 new queries after a rolling cache of 5 positions, window 5",
             (torch.arange(r, r + 3), torch.arange(r - 5, r + 3), 5)),
        degenerate(Case("window 1: each query sees only itself", (torch.arange(5), torch.arange(5), 1))),
        Case("length 7, window 5", (torch.arange(7), torch.arange(7), 5)),
        Case("keys in shuffled order, window 3", (torch.arange(6), torch.randperm(6, generator=g), 3)),
        degenerate(Case("window longer than the sequence: the causal mask", (torch.arange(4), torch.arange(4), 10))),
    ]


def _window_case(v: View, wider: int = 0, symmetric: bool = False) -> torch.Tensor:
    """The case's window mask, ``0 <= i - j < window + wider`` (``|i - j|`` with ``symmetric``)."""
    query_positions, key_positions, window = v.args
    offset = query_positions[:, None] - key_positions[None, :]
    offset = offset.abs() if symmetric else offset
    return (offset >= 0) & (offset < window + wider)


def _wrong_entry(v: View) -> str | None:
    """The first wrong entry, with the positions and offset it stands for."""
    if torch.equal(v.got.mask, v.want.mask):
        return None
    row, col = (int(x) for x in (v.got.mask != v.want.mask).nonzero()[0])
    i, j = int(v.args[0][row]), int(v.args[1][col])
    return (f"entry ({row}, {col}) (query position {i}, key position {j}) should be "
            f"{bool(v.want.mask[row, col])}: i - j = {i - j}, window {v.args[2]}")


_WINDOW = Check(
    reference=_window_case,
    outputs=(Out("mask", floating=False, finite=False),),
    properties=(lambda v: None if v.got.mask.dtype == torch.bool else Finding(
        f"the mask must be a bool tensor, got dtype {v.got.mask.dtype}", FailureKind.DTYPE),),
    mistakes=(Mistake(lambda v: _window_case(v, wider=1), "your window is one too wide: query i must see keys "
                      "i - w + 1 .. i (w keys, itself included), that is 0 <= i - j < w"),
              Mistake(lambda v: _window_case(v, wider=-1),
                      "your window is one too narrow: each query sees w keys, itself included (0 <= i - j < w)"),
              Mistake(lambda v: _window_case(v, symmetric=True), "your mask lets queries see the future: the window "
                      "is causal, 0 <= i - j (keys j > i are hidden)"),
              Mistake(lambda v: ~v.want.mask, "your mask is the complement: True must mean 'may attend'")),
    matches=lambda got, wrong: torch.equal(got, wrong),
    explain=(_wrong_entry,),
)


# --- part 3: one tile of the FlashAttention backward pass ---------------------------------------------------
def _tile_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, lead: tuple[int, ...], n_q: int, n_k: int, d: int, rows: slice, cols: slice) -> Case:
        q, k, v = (randn(g, *lead, n, d, dtype=torch.float64) for n in (n_q, n_k, n_k))
        grad_out = randn(g, *lead, n_q, d, dtype=torch.float64)
        scale = 1 / math.sqrt(d)
        scores = q @ k.transpose(-2, -1) * scale
        lse = torch.logsumexp(scores, dim=-1)  # over ALL keys: the tile sees only some of them
        delta = (grad_out * (torch.softmax(scores, dim=-1) @ v)).sum(-1)
        args = (q[..., rows, :], k[..., cols, :], v[..., cols, :], grad_out[..., rows, :], lse[..., rows],
                delta[..., rows], scale)
        return Case(name, args, data={"full": (q, k, v, grad_out)} if rows == cols == slice(None) else {})

    return [
        degenerate(case("one tile is the whole problem: 5 queries, 5 keys, d = 4 (checked against autograd)", (),
                        5, 5, 4, slice(None), slice(None))),
        case("queries 0-3 and keys 4-7 of 8 queries and 12 keys, d = 8", (), 8, 12, 8, slice(0, 4), slice(4, 8)),
        case("queries 4-6 and keys 0-4 of 7 queries and 9 keys, d = 4", (), 7, 9, 4, slice(4, 7), slice(0, 5)),
        case("leading dims (2, 3): queries 2-4, keys 3-5 of 6 and 6", (2, 3), 6, 6, 4, slice(2, 5), slice(3, 6)),
    ]


def _tile_grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, lse: torch.Tensor,
                delta: torch.Tensor, scale: float, *, normalise: bool = False, use_delta: bool = True,
                scale_grads: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    scores = q @ k.transpose(-2, -1) * scale
    weights = torch.softmax(scores, -1) if normalise else torch.exp(scores - lse[..., None])
    grad_v = weights.transpose(-2, -1) @ grad_out
    grad_weights = grad_out @ v.transpose(-2, -1)
    grad_scores = weights * (grad_weights - delta[..., None]) if use_delta else weights * grad_weights
    factor = scale if scale_grads else 1.0
    return factor * grad_scores @ k, factor * grad_scores.transpose(-2, -1) @ q, grad_v


_GRADS = ("grad_query", "grad_key", "grad_value")
_TILE_MISTAKES = (  # a wrong formula (flags of _tile_grads) and its message, tried on each gradient
    ({"normalise": True}, "your weights are normalised within the tile: the tile holds only some of each row's "
     "keys, so rebuild them as exp(S - lse) with the saved log-sum-exp of the whole row"),
    ({"use_delta": False},
     "your dS is P * dP: the softmax's backward pass subtracts D from dP first, dS = P * (dP - D)"),
    ({"scale_grads": False}, "the scores were multiplied by scale, so dQ and dK carry the factor scale as well"),
)


def _autograd_agrees(v: View) -> str | None:
    """With one tile covering everything, the reference formulas must give autograd's gradients."""
    if "full" not in v.data:
        return None
    *inputs, grad_out = v.data["full"]
    q, k, val = (t.clone().requires_grad_() for t in inputs)
    (torch.softmax(q @ k.transpose(-2, -1) * v.args[-1], -1) @ val).backward(grad_out)
    if all(torch.allclose(getattr(v.want, name), t.grad) for name, t in zip(_GRADS, (q, k, val))):
        return None
    return Finding("internal error: the reference gradients disagree with autograd; please report it",
                   FailureKind.OTHER)  # pragma: no cover


_TILE = Check(
    reference=lambda v: _tile_grads(*v.args),
    outputs=tuple(Out(name, "the backward formulas for this tile", atol=1e-6, rtol=1e-5) for name in _GRADS),
    before=(_autograd_agrees,),
    mistakes=(*(Mistake(lambda v, name=name: getattr(v.want, name) / v.args[-1], f"your {name} lacks the factor "
                        "scale: the scores were multiplied by scale, so dQ and dK carry it as well", on=name)
                for name in ("grad_query", "grad_key")),
              *(Mistake(lambda v, flags=flags, i=i: _tile_grads(*v.args, **flags)[i], message, on=name)
                for flags, message in _TILE_MISTAKES for i, name in enumerate(_GRADS))),
)


EXERCISE = with_texts(Exercise(  # title, summaries and hints: ex15.toml
    id="ex15", chapters=("15_attention_at_inference_scale",), preamble=PREAMBLE,
    parts=(
        Part("grouped_query_attention", points=3, make_cases=_gqa_cases, verify=_GQA),
        Part("sliding_window_mask", points=2, make_cases=_window_cases, verify=_WINDOW),
        Part("flash_backward_tile", points=3, make_cases=_tile_cases, verify=_TILE),
    ),
))
