"""Exercise 14, positions for long contexts: the checks behind ``exercises/ex14_positions_for_long_contexts.ipynb``.

The learner writes the rotary embedding (pairs ``(2i, 2i+1)`` turned by ``position · base^(-2i/d)``), the score of
a rotated query and key at an offset, ALiBi (slopes and bias) and, from chapter 13b, rotate-half rotary (pairs
``(i, i + d/2)``) and the row permutation that converts Llama checkpoints to it. References are the library's
``apply_rotary``, ``alibi_slopes`` and ``alibi_bias`` in float64. Recognised mistakes: frequencies reversed or
``base^(-i/d)``, the other pairing, a rotation the wrong way, the query rotated instead of the key, ALiBi slopes
reversed or from the power-of-two rule, a bias of the wrong sign or not aligned with the last keys, a cos/sin table
for the other pairing, the inverse permutation, evens and odds split over all rows, the columns permuted.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attention_course.grading.compare import close_problem, f64, matches
from attention_course.grading.declare import Check, Out, View, mistakes_on
from attention_course.grading.package_view import instructor_side
from attention_course.grading.spec import (
    Case,
    Exercise,
    Mistake,
    Part,
    call_expecting_error,
    degenerate,
    preamble,
    randn,
    with_texts,
)

# The references run in the grader's process only: the sandbox's view of the package lacks them.
reference_bias = instructor_side("attention_course.alibi", "alibi_bias")
reference_slopes = instructor_side("attention_course.alibi", "alibi_slopes")
reference_rotary = instructor_side("attention_course.rotary", "apply_rotary")

PREAMBLE = preamble()


# --- variants of the rotary embedding that learners write by mistake -----------------------------------------
def _rotate(x: torch.Tensor, positions: torch.Tensor, frequencies: torch.Tensor, direction: float = 1.0,
            halves: bool = False) -> torch.Tensor:
    """Rotate pairs of ``x`` (float64) by ``positions * frequencies``; ``halves`` pairs i with i + d/2."""
    angles = positions.to(torch.float64)[..., None] * frequencies  # (L, d/2)
    cos, sin = angles.cos(), direction * angles.sin()
    x = f64(x)
    if halves:
        first, second = x[..., : x.size(-1) // 2], x[..., x.size(-1) // 2:]
        return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def _frequencies(d: int, base: float, exponent: float = 2.0) -> torch.Tensor:
    return float(base) ** (-exponent * torch.arange(d // 2, dtype=torch.float64) / d)


ROTARY_MISTAKES = (
    Mistake(lambda x, p, base: _rotate(x, p, _frequencies(x.size(-1), base).flip(0)),
            "your frequencies are in reverse order: pair i must turn at base^(-2i/d), so the first pair "
            "(features 0 and 1) is the fastest (1 radian per position) and the last the slowest"),
    Mistake(lambda x, p, base: _rotate(x, p, _frequencies(x.size(-1), base, exponent=1.0)),
            "pair i turns at base^(-2i/d): your exponent is -i/d (the 2 is missing)"),
    Mistake(lambda x, p, base: _rotate(x, p, _frequencies(x.size(-1), base), halves=True),
            "you rotated feature i with feature i + d/2 (the GPT-NeoX convention); this exercise, like "
            "chapter 14 and RoFormer, rotates neighbouring features: pairs (0, 1), (2, 3), ..."),
    Mistake(lambda x, p, base: _rotate(x, p, _frequencies(x.size(-1), base), direction=-1.0),
            "you rotate the wrong way (by minus the angle): the new even feature is x_even cos - x_odd sin, "
            "the new odd feature x_even sin + x_odd cos"),
    Mistake(lambda x, p, base: _rotate(x, torch.arange(x.size(-2)), _frequencies(x.size(-1), base)),
            "you rotated row l by the angle of position l: use the positions argument (row l sits at "
            "positions[l])"),
    Mistake(lambda x, p, base: _rotate(x, p, _frequencies(x.size(-1), 10000.0)),
            "you ignored the base argument (the frequencies are base^(-2i/d))"),
)


# --- part 1: the rotary embedding ----------------------------------------------------------------------------
def _rotary_cases(g: torch.Generator) -> list[Case]:
    scattered = torch.randperm(40, generator=g)[:5]
    return [
        Case("x (6, 8) at positions 0..5", (randn(g, 6, 8), torch.arange(6))),
        Case("heads: x (2, 3, 5, 16) at positions 100..104", (randn(g, 2, 3, 5, 16), torch.arange(100, 105))),
        Case("base 100, x (4, 6)", (randn(g, 4, 6), torch.arange(4)), {"base": 100.0}),
        Case("positions not in order: 5 rows at scattered positions below 40", (randn(g, 5, 8), scattered)),
        degenerate(Case("float64 input, d = 2 (a single pair), positions 0..6",
             (randn(g, 7, 2, dtype=torch.float64), torch.arange(7)))),
        Case("an odd feature size (d = 5) raises a ValueError", (randn(g, 3, 5), torch.arange(3)),
             data={"error": True}),
    ]


def _odd_size(v: View) -> tuple[tuple[int], str] | None:
    """What a case with an odd feature size demands: a ValueError naming the size."""
    d = v.args[0].size(-1)
    why = f"d = {d} is odd (features are rotated in pairs); name the feature size in the message"
    return ((d,), why) if v.data.get("error") else None


def _rotary_inputs(v: View) -> tuple:
    """(x, positions, base), as the tables of rotary mistakes take them."""
    return (*v.args, v.kwargs.get("base", 10000.0))


def _length_changed(v: View) -> str | None:
    """A wrong rotation that also changes lengths is told that a rotation keeps them."""
    got, want = getattr(v.got, "rotated x"), getattr(v.want, "rotated x")
    problem = close_problem(got, want, "your rotated x", "the rotary embedding", atol=1e-5, rtol=1e-4)
    if problem and not torch.allclose(f64(got).norm(dim=-1), v.x[0].norm(dim=-1), atol=1e-4, rtol=1e-4):
        return problem + " (a rotation keeps the length of every row; yours changes it)"
    return None


def _rotary_check(pairing: str, reference: str, mistakes: tuple[Mistake, ...], explain: tuple = ()) -> Check:
    """A rotary part: an odd size raises; else the library's rotation with this pairing, and its mistakes."""
    return Check(
        reference=lambda v: reference_rotary(v.x[0], v.args[1], base=_rotary_inputs(v)[2], pairing=pairing),
        outputs=(Out("rotated x", reference, dtype=lambda v: v.args[0].dtype),),
        raises=_odd_size,
        mistakes=mistakes_on(mistakes, _rotary_inputs),
        explain=explain,
    )


# --- part 2: the score at an offset --------------------------------------------------------------------------
def _offset_cases(g: torch.Generator) -> list[Case]:
    return [
        Case("8 query/key pairs, d = 8, offset 3", (randn(g, 8, 8), randn(g, 8, 8), 3)),
        Case("offset -5 (the key 5 positions before the query), d = 16", (randn(g, 6, 16), randn(g, 6, 16), -5)),
        degenerate(Case("offset 0: the plain dot product", (randn(g, 4, 8), randn(g, 4, 8), 0))),
        Case("offset 200, base 500, d = 4", (randn(g, 5, 4), randn(g, 5, 4), 200), {"base": 500.0}),
    ]


def _offset_scores(v: View, query_moves: bool = False) -> torch.Tensor:
    """(n,) scores of each query at position p and its key at p + offset (any p gives the same: 1000 here);
    with ``query_moves``, the query at p + offset and the key at p (the offset's sign flipped)."""
    q, k, offset = v.x
    p = torch.full((q.size(0),), 1000)
    base = v.kwargs.get("base", 10000.0)
    query_at, key_at = (p + offset, p) if query_moves else (p, p + offset)
    return (reference_rotary(q, query_at, base) * reference_rotary(k, key_at, base)).sum(-1)


_OFFSET = Check(
    reference=_offset_scores,
    outputs=(Out("score vector", "the rotated query and key's dot product"),),
    mistakes=(Mistake(lambda v: _offset_scores(v, query_moves=True) if v.args[2] else None,
                      lambda v: f"your scores are those of offset {-v.args[2]}: with the query at p and the key at "
                      "p + offset, the score is q R_offset k^T, i.e. the query against the key rotated by the "
                      "offset (rotating the query by the offset turns it the other way)"),
              Mistake(lambda v: (v.x[0] * v.x[1]).sum(-1) if v.args[2] else None,
                      "your scores ignore the offset: the key must be rotated by it")),
)


# --- part 3: ALiBi's slopes and bias, added to the scores ---------------------------------------------------
def _alibi_cases(g: torch.Generator) -> list[Case]:
    # The known mistakes (the power-of-two slope formula for every head count; the queries placed at the
    # first positions, not the last) are right on a power-of-two head count or on as many queries as keys:
    # such cases must pass for full marks but earn no credit on their own (credit=False).
    return [
        Case("scores (2, 8, 5, 5): 8 heads, self-attention", (randn(g, 2, 8, 5, 5),), credit=False),
        Case("scores (1, 4, 1, 7): one query (the newest token), 7 keys", (randn(g, 1, 4, 1, 7),), credit=False),
        Case("scores (2, 2, 3, 6): the last 3 positions query 6 keys", (randn(g, 2, 2, 3, 6),), credit=False),
        Case("scores (1, 6, 4, 4): 6 heads (not a power of two)", (randn(g, 1, 6, 4, 4),), credit=False),
        Case("scores (1, 12, 3, 3): 12 heads (not a power of two)", (randn(g, 1, 12, 3, 3),), credit=False),
        Case("scores (3, 1, 4, 4): a single head", (randn(g, 3, 1, 4, 4),), credit=False),
        Case("scores (1, 6, 4, 6): 6 heads, the last 4 positions query 6 keys", (randn(g, 1, 6, 4, 6),)),
        Case("scores (2, 12, 2, 5): 12 heads, the last 2 positions query 5 keys", (randn(g, 2, 12, 2, 5),)),
        degenerate(Case("scores (1, 3, 1, 4): 3 heads, one query (the newest token), 4 keys", (randn(g, 1, 3, 1, 4),))),
    ]


def _geometric(heads: int, first: int = 1) -> torch.Tensor:
    return torch.tensor([2.0 ** (-8.0 * h / heads) for h in range(first, first + heads)], dtype=torch.float64)


def _bias(slopes: torch.Tensor, length_q: int, length_k: int, aligned: bool = True, absolute: bool = True,
          sign: float = -1.0) -> torch.Tensor:
    query_at = torch.arange(length_q)[:, None] + ((length_k - length_q) if aligned else 0)
    distance = (query_at - torch.arange(length_k)[None, :]).double()
    if absolute:
        distance = distance.abs()
    return sign * slopes.double()[:, None, None] * distance  # (H, Lq, Lk)


def _alibi_mistake(bias: Callable[[torch.Tensor, int, int, int], torch.Tensor | None],
                   message: str | Callable[[View], str]) -> Mistake:
    """A wrong ALiBi: ``bias(right slopes, heads, Lq, Lk)`` (H, Lq, Lk) added to the scores; not told apart
    (``None``) where it equals the right bias or does not apply to this head count."""
    def variant(v: View) -> torch.Tensor | None:
        _, heads, length_q, length_k = v.x[0].shape
        wrong = bias(reference_slopes(heads).double(), heads, length_q, length_k)
        right = reference_bias(heads, length_q, length_k).double()
        return None if wrong is None or torch.allclose(wrong, right) else v.x[0] + wrong
    return Mistake(variant, message)


def _closest(heads: int) -> int:
    """The largest power of two not above ``heads``."""
    return 2 ** math.floor(math.log2(heads))


_ALIBI_MISTAKES = (
    Mistake(lambda v: v.x[0], "your scores came back unchanged: add each head's bias -m_h |i - j|"),
    _alibi_mistake(lambda m, h, lq, lk: _bias(m, lq, lk, sign=1.0),
                   "your bias has the wrong sign: it must lower the scores of distant keys, scores - m_h |i - j|"),
    _alibi_mistake(lambda m, h, lq, lk: _bias(m.flip(0), lq, lk),
                   "your slopes are in reverse order: head 1 gets the steepest slope, 2^(-8/H), and the last head "
                   "the gentlest, 2^(-8)"),
    _alibi_mistake(lambda m, h, lq, lk: _bias(_geometric(h, first=0), lq, lk),
                   "your slopes start at 2^0 = 1: the exponents are -8h/H for h = 1 .. H, not 0 .. H-1"),
    _alibi_mistake(lambda m, h, lq, lk: None if h == _closest(h) else _bias(_geometric(h), lq, lk),
                   lambda v: f"{v.args[0].size(1)} is not a power of two: the paper takes all slopes of n = "
                   f"{_closest(v.args[0].size(1))} heads, then every other slope (the 1st, 3rd, ...) of the sequence "
                   f"for 2n = {2 * _closest(v.args[0].size(1))} heads until there are {v.args[0].size(1)}"),
    _alibi_mistake(lambda m, h, lq, lk: None if h == _closest(h) else _bias(reference_slopes(2 * _closest(h))[:h],
                                                                            lq, lk),
                   "for a head count that is not a power of two, the extra slopes are every other slope of the "
                   "sequence for 2n heads (the 1st, 3rd, 5th, ...), after all n slopes of the sequence for n heads"),
    _alibi_mistake(lambda m, h, lq, lk: _bias(m, lq, lk, absolute=False),
                   "use the distance |i - j|: keys after the query (j > i) must get a penalty too (a causal mask "
                   "removes them separately when the model needs one)"),
    _alibi_mistake(lambda m, h, lq, lk: _bias(m, lq, lk, aligned=False),
                   "the queries are the newest positions: query i sits at position i + Lk - Lq (with one query and 7 "
                   "keys, the query is position 6)"),
)

_ALIBI = Check(
    reference=lambda v: v.x[0] + reference_bias(*v.x[0].shape[1:]).double(),
    outputs=(Out("biased scores", "scores - m_h |i - j|", rtol=1e-5),),
    mistakes=_ALIBI_MISTAKES,
    matches=lambda got, wrong: matches(got, wrong, atol=1e-5, rtol=1e-5),
)


# --- part 4: rotary in the Llama convention (rotate-half pairs) -----------------------------------------------
def _rotate_mixed(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate-half's formula x cos + rotate_half(x) sin with the cos/sin tables laid out for interleaved pairs
    (each frequency repeated twice in a row): the two conventions mixed."""
    x = f64(x)
    d = x.size(-1)
    angles = positions.to(torch.float64)[:, None] * _frequencies(d, base).repeat_interleave(2)  # (L, d)
    first, second = x[..., : d // 2], x[..., d // 2:]
    return x * angles.cos() + torch.cat((-second, first), dim=-1) * angles.sin()


ROTATE_HALF_MISTAKES = (
    Mistake(lambda x, p, base: _rotate(x, p, _frequencies(x.size(-1), base)),
            "you paired neighbouring features (2i, 2i+1), part 1's convention: in the Llama convention feature "
            "i turns with feature i + d/2"),
    Mistake(_rotate_mixed,
            "your cos and sin tables repeat each frequency twice in a row (the interleaved layout): with "
            "rotate-half pairs, the angle table is the d/2 angles followed by the same d/2 angles again"),
    Mistake(lambda x, p, base: _rotate(x, p, _frequencies(x.size(-1), base), direction=-1.0, halves=True),
            "you rotate the wrong way: the first half becomes x1 cos - x2 sin and the second x1 sin + x2 cos "
            "(rotate_half(x) is (-x2, x1), not (x2, -x1))"),
    Mistake(lambda x, p, base: _rotate(x, p, _frequencies(x.size(-1), base).flip(0), halves=True),
            "your frequencies are in reverse order: pair i = (i, i + d/2) turns at base^(-2i/d), the first "
            "pair fastest"),
    Mistake(lambda x, p, base: _rotate(x, p, _frequencies(x.size(-1), base, exponent=1.0), halves=True),
            "pair i turns at base^(-2i/d): your exponent is -i/d (the 2 is missing)"),
    Mistake(lambda x, p, base: _rotate(x, torch.arange(x.size(-2)), _frequencies(x.size(-1), base), halves=True),
            "you rotated row l by the angle of position l: use the positions argument (row l sits at "
            "positions[l])"),
)


def _rotate_half_cases(g: torch.Generator) -> list[Case]:
    scattered = torch.randperm(60, generator=g)[:6]
    return [
        Case("x (6, 8) at positions 0..5", (randn(g, 6, 8), torch.arange(6))),
        Case("heads: x (2, 4, 5, 12) at positions 40..44", (randn(g, 2, 4, 5, 12), torch.arange(40, 45))),
        Case("base 500000 (Llama 3's), x (3, 16) at positions 1000..1002",
             (randn(g, 3, 16), torch.arange(1000, 1003)), {"base": 500000.0}),
        Case("positions not in order: 6 rows at scattered positions below 60", (randn(g, 6, 10), scattered)),
        Case("float64 input, x (1, 3, 7, 6)", (randn(g, 1, 3, 7, 6, dtype=torch.float64), torch.arange(7))),
        Case("d = 2: a single pair, where both conventions agree", (randn(g, 5, 2), torch.arange(5)), credit=False),
        Case("an odd feature size (d = 7) raises a ValueError", (randn(g, 3, 7), torch.arange(3)),
             data={"error": True}),
    ]


# --- part 5: converting a projection from interleaved to rotate-half pairs ------------------------------------
def _half_order(d_head: int) -> torch.Tensor:
    """The new order of one head's features: the even ones (first of each pair), then the odd ones."""
    return torch.cat((torch.arange(0, d_head, 2), torch.arange(1, d_head, 2)))


def _permutation(n: int, inverse: bool = False) -> torch.Tensor:
    """Evens then odds over ``n`` items (any n), or its inverse."""
    order = torch.cat((torch.arange(0, n, 2), torch.arange(1, n, 2)))
    return torch.argsort(order) if inverse else order


def _permuted_rows(weight: torch.Tensor, num_heads: int, inverse: bool = False) -> torch.Tensor:
    d_head = weight.size(0) // num_heads
    order = _half_order(d_head)
    if inverse:
        order = torch.argsort(order)
    rows = (torch.arange(num_heads)[:, None] * d_head + order[None, :]).flatten()
    return f64(weight)[rows]


_CONVERSION_MISTAKES = (  # (weight, num_heads) -> a wrong conversion
    Mistake(lambda w, h: _permuted_rows(w, h, inverse=True),
            "you applied the inverse permutation (rotate-half to interleaved): new row i of each head is old row "
            "2i, and new row i + d/2 is old row 2i + 1"),
    Mistake(lambda w, h: _permuted_rows(w, 1) if h > 1 else None,
            "you split the even and odd rows of the whole weight: the pairs live inside each head, so "
            "permute each head's d_head rows separately"),
    *(Mistake(lambda w, h, inverse=inverse: f64(w)[:, _permutation(w.size(1), inverse)],
              "you permuted the columns (the model's input features), not the rows: the rotation acts on the "
              "projection's outputs, which are the rows of an nn.Linear weight (out_features, in_features)")
      for inverse in (False, True)),
    Mistake(lambda w, h: (f64(w).reshape(w.size(0), h, -1)[:, :, _half_order(w.size(1) // h)].reshape(w.shape)
                          if w.size(1) % h == 0 and (w.size(1) // h) % 2 == 0 else None),
            "you permuted the columns (the model's input features) head by head, not the rows: the rotation acts "
            "on the projection's outputs, which are the rows of an nn.Linear weight (out_features, in_features)"),
    Mistake(lambda w, h: f64(w), "your weight came back unchanged: each head's rows must be reordered"),
)


def _conversion_cases(g: torch.Generator) -> list[Case]:
    return [
        Case("4 heads of 6 features, d_model 10: weight (24, 10)", (randn(g, 24, 10), 4)),
        Case("2 heads of 8 features, a square weight (16, 16)", (randn(g, 16, 16), 2)),
        # one head: splitting the whole weight's rows is splitting the head's (that mistake cannot show here)
        degenerate(Case("one head of 10 features, d_model 7", (randn(g, 10, 7), 1))),
        Case("2 key-value heads of 12 features (a grouped-query key projection), d_model 48",
             (randn(g, 24, 48), 2)),
        Case("float64 weight, 3 heads of 8 features, d_model 5", (randn(g, 24, 5, dtype=torch.float64), 3)),
        Case("d_head = 2: the one pair is already (i, i + d/2), nothing moves", (randn(g, 6, 4), 3), credit=False),
        Case("an odd head size (3 heads of 7 features) raises a ValueError", (randn(g, 21, 4), 3),
             data={"error": True, "numbers": (7,)}),
        Case("10 rows do not split into 4 heads: a ValueError", (randn(g, 10, 6), 4),
             data={"error": True, "numbers": (10, 4)}),
    ]


def _conversion_error(v: View) -> tuple[tuple[int, ...], str] | None:
    if not v.data.get("error"):
        return None
    numbers = v.data["numbers"]
    why = (f"the head size {numbers[0]} is odd (rotary needs pairs)" if len(numbers) == 1 else
           f"{numbers[0]} rows do not split into {numbers[1]} heads")
    return numbers, why + "; name the sizes in the message"


_CONVERSION = Check(
    reference=lambda v: _permuted_rows(*v.args),
    outputs=(Out("weight", "the weight with each head's rows reordered (evens, then odds)", atol=0.0, rtol=0.0,
                 dtype=lambda v: v.args[0].dtype),),
    raises=_conversion_error,
    mistakes=mistakes_on(_CONVERSION_MISTAKES, lambda v: v.args),
    matches=lambda got, wrong: matches(got, wrong, atol=0.0, rtol=0.0),
)


EXERCISE = with_texts(Exercise(  # title, summaries and hints: ex14.toml
    id="ex14", chapters=("14_positions_for_long_contexts",), preamble=PREAMBLE,
    parts=(
        Part("rotate_pairs", points=3, make_cases=_rotary_cases,
             verify=_rotary_check("interleaved", "the rotary embedding", ROTARY_MISTAKES, (_length_changed,)),
             run=call_expecting_error),
        Part("score_at_offset", points=2, make_cases=_offset_cases, verify=_OFFSET),
        Part("add_alibi", points=4, make_cases=_alibi_cases, verify=_ALIBI),
        Part("rotate_half", points=2, make_cases=_rotate_half_cases,
             verify=_rotary_check("half", "rotate-half rotary", ROTATE_HALF_MISTAKES), run=call_expecting_error),
        Part("interleaved_to_half", points=2, make_cases=_conversion_cases, verify=_CONVERSION,
             run=call_expecting_error),
    ),
))
