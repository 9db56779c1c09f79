"""Exercise 16, what heads learn: the checks behind ``exercises/ex16_what_heads_learn.ipynb``.

The learner builds a batch of repeated random tokens, the induction score of every head, and the loss change
when one head of a one-layer attention-only model is zero-ablated. References: the library's
``repeated_random_tokens`` and ``induction_score``, and a float64 forward pass written here. Mistakes recognised:
halves that do not repeat, tokens not drawn as specified, the earlier occurrence itself as the target, queries
scored that have no earlier occurrence (or only the first half), an ablation before the softmax, a wrong sign.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attention_course.grading.compare import f64
from attention_course.grading.declare import Check, Out, View, mistakes_on
from attention_course.grading.findings import FailureKind, Finding
from attention_course.grading.spec import Case, Exercise, Mistake, Part, preamble, randn, with_texts
from attention_course.interpretability import induction_score as reference_induction_score
from attention_course.interpretability import repeated_random_tokens as reference_repeated

PREAMBLE = preamble()


# --- part 1: the repeated-sequence batch ---------------------------------------------------------------------
def _batch_cases(g: torch.Generator) -> list[Case]:
    seed = int(torch.randint(0, 10_000, (), generator=g))
    return [
        Case("4 sequences, half length 6, 10 token types", (4, 6, 10, seed)),
        Case("1 sequence, half length 20, 50 token types", (1, 20, 50, seed + 1)),
        Case("8 sequences, half length 3, 2 token types", (8, 3, 2, seed + 2)),
        Case("3 sequences, half length 1, 7 token types", (3, 1, 7, seed + 3)),
    ]


def _halves_repeat(v: View) -> str | None:
    half = v.args[1]
    if torch.equal(v.got.batch[:, :half], v.got.batch[:, half:]):
        return None
    return ("the second half of each sequence must repeat the first, token for token: tokens[:, n:] equal to "
            "tokens[:, :n] (draw n tokens once and concatenate them with themselves)")


def _token_ids(v: View) -> str | None:
    tokens, vocab = v.got.batch, v.args[2]
    if tokens.dtype != torch.int64:
        return Finding(f"expected int64 token ids, got dtype {tokens.dtype}", FailureKind.DTYPE)
    low, high = int(tokens.min()), int(tokens.max())
    if 0 <= low and high < vocab:
        return None
    return f"token ids must lie in 0 .. {vocab - 1}, yours range from {low} to {high}"


def _drawn(v: View) -> str | None:
    if torch.equal(v.got.batch, v.want.batch):
        return None
    return ("your tokens are not the ones torch.randint(vocab_size, (batch_size, half_length), generator=...) "
            "draws from a generator seeded with seed: make torch.Generator().manual_seed(seed), draw the "
            "first half with it, in one call")


_BATCH = Check(
    reference=lambda v: reference_repeated(*v.args[:3], torch.Generator().manual_seed(v.args[3])),
    outputs=(Out("batch", floating=False, finite=False),),
    properties=(_halves_repeat, _token_ids),
    explain=(_drawn,),
)


# --- part 2: the induction score -----------------------------------------------------------------------------
def _causal_weights(g: torch.Generator, batch: int, heads: int, length: int) -> torch.Tensor:
    scores = randn(g, batch, heads, length, length, scale=2.0)
    allowed = torch.ones(length, length, dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)


def _induction_pattern(tokens: torch.Tensor) -> torch.Tensor:
    """(B, 3, L, L) on repeated tokens: head 0 a perfect induction head, head 1 attends to the earlier
    occurrence itself (one key too early), head 2 to the query's own position."""
    batch, length = tokens.shape
    half = length // 2
    weights = torch.eye(length).repeat(batch, 3, 1, 1)
    for i in range(half, length):
        weights[:, :2, i] = 0.0
        weights[:, 0, i, i - half + 1] = 1.0
        weights[:, 1, i, i - half] = 1.0
    return weights


def _induction_cases(g: torch.Generator) -> list[Case]:
    few_types = reference_repeated(2, 8, 4, g)  # many accidental repeats in the first half
    perfect_tokens = torch.stack([torch.randperm(30, generator=g)[:6] for _ in range(3)]).repeat(1, 2)
    text_like = torch.randint(0, 6, (2, 12), generator=g)  # not a repeated sequence: repeats anywhere
    return [
        Case("3 sequences of 2 x 6 distinct tokens: a perfect induction head, a head on the earlier occurrence, "
             "a head on the diagonal", (_induction_pattern(perfect_tokens), perfect_tokens)),
        Case("random causal weights (2, 4, 16, 16), repeated sequences of 16 token types",
             (_causal_weights(g, 2, 4, 16), reference_repeated(2, 8, 16, g))),
        Case("random causal weights (2, 3, 16, 16), repeated sequences of 4 token types (repeats in both halves)",
             (_causal_weights(g, 2, 3, 16), few_types)),
        Case("random causal weights (2, 2, 12, 12), tokens not repeated as halves (6 token types)",
             (_causal_weights(g, 2, 2, 12), text_like)),
        Case("random causal weights (1, 2, 10, 10) in float64, repeated sequences of 50 token types",
             (_causal_weights(g, 1, 2, 10).double(), reference_repeated(1, 5, 50, g))),
    ]


def _targets(tokens: torch.Tensor, shift: int) -> torch.Tensor:
    """(B, L, L) bool: key j + shift for every earlier occurrence j of query i's token."""
    positions = torch.arange(tokens.size(1))
    earlier = (tokens[:, :, None] == tokens[:, None, :]) & (positions[None, :] < positions[:, None])
    if shift == 0:
        return earlier
    targets = torch.zeros_like(earlier)
    targets[:, :, 1:] = earlier[:, :, :-1]
    return targets


def _score(weights: torch.Tensor, targets: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    on_targets = (f64(weights) * targets[:, None].double()).sum(dim=-1)  # (B, H, L)
    return (on_targets * scored[:, None].double()).sum(dim=(0, 2)) / scored.sum().clamp(min=1)


INDUCTION_MISTAKES = (
    Mistake(lambda w, t: _score(w, _targets(t, 0), _targets(t, 0).any(-1)),
            "you measured the attention on the earlier occurrence of the token itself (key j): the induction "
            "target is the key right after it (j + 1), the token that came next last time"),
    Mistake(lambda w, t: _score(w, _targets(t, 1), torch.ones_like(t, dtype=torch.bool)),
            "you averaged over every query: only queries whose token occurred earlier have an induction target, "
            "and only they count"),
    Mistake(lambda w, t: _score(w, _targets(t, 1), (torch.arange(t.size(1)) < t.size(1) // 2)[None].expand_as(t)),
            "you scored the queries of the first half: the induction targets are those of the queries whose "
            "token occurred before (on a repeated sequence, the second half)"),
)


_INDUCTION = Check(
    reference=lambda v: reference_induction_score(*v.x),
    outputs=(Out("scores", "the induction score"),),
    mistakes=mistakes_on(INDUCTION_MISTAKES, lambda v: v.args),
)


# --- part 3: an ablation's loss change -----------------------------------------------------------------------
def _ablation_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, batch: int, length: int, d_model: int, heads: int, vocab: int, head: int) -> Case:
        d_head = d_model // heads
        x = randn(g, batch, length, d_model)
        w_q, w_k, w_v = (randn(g, heads, d_model, d_head, scale=d_model ** -0.5 * 2) for _ in range(3))
        w_o = randn(g, heads, d_head, d_model, scale=d_head ** -0.5)
        w_u = randn(g, d_model, vocab, scale=d_model ** -0.5 * 2)
        tokens = torch.randint(0, vocab, (batch, length), generator=g)
        return Case(name, (x, w_q, w_k, w_v, w_o, w_u, tokens, head))

    return [
        case("2 sequences of 6, d_model 8, 2 heads, 5 tokens: ablate head 0", 2, 6, 8, 2, 5, 0),
        case("2 sequences of 6, d_model 8, 2 heads, 5 tokens: ablate head 1", 2, 6, 8, 2, 5, 1),
        case("3 sequences of 9, d_model 12, 4 heads, 7 tokens: ablate head 2", 3, 9, 12, 4, 7, 2),
        case("1 sequence of 2 (one prediction), d_model 4, 1 head, 3 tokens: ablate head 0", 1, 2, 4, 1, 3, 0),
    ]


def _logits(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, w_o: torch.Tensor,
            w_u: torch.Tensor, head: int | None, how: str = "output") -> torch.Tensor:
    """A one-layer attention-only model in float64; ``how`` says where head ``head`` is ablated."""
    x, w_q, w_k, w_v, w_o, w_u = map(f64, (x, w_q, w_k, w_v, w_o, w_u))
    q, k, v = (torch.einsum("bld,hde->bhle", x, w) for w in (w_q, w_k, w_v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, L, L)
    if head is not None and how == "scores":
        scores[:, head] = 0.0
    allowed = torch.ones(x.size(1), x.size(1), dtype=torch.bool).tril()
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    outputs = weights @ v  # (B, H, L, d_head)
    if head is not None and how == "output":
        outputs[:, head] = 0.0
    residual = x + torch.einsum("bhle,hed->bld", outputs, w_o)
    return residual @ w_u  # (B, L, V)


def _loss(logits: torch.Tensor, tokens: torch.Tensor) -> float:
    return float(F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1)))


def _change(case_args: tuple, how: str = "output", sign: float = 1.0) -> float:
    *model, tokens, head = case_args
    clean = _loss(_logits(*model, None), tokens)
    ablated = _loss(_logits(*model, head, how), tokens)
    return sign * (ablated - clean)


_ABLATION = Check(
    reference=lambda v: torch.tensor(_change(v.args), dtype=torch.float64),
    outputs=(Out("loss change", "the ablated loss minus the clean loss", scalar=True),),
    mistakes=(Mistake(lambda v: _change(v.args, how="scores"),
                      "your ablated head still writes: you changed its scores (or weights) before the softmax, which "
                      "renormalises them into an average of the values; zero the head's output (weights @ values) "
                      "instead"),
              Mistake(lambda v: _change(v.args, sign=-1.0), "your change has the wrong sign: return the ablated loss "
                      "minus the clean loss (positive when the head helped)"),
              Mistake(lambda v: torch.zeros((), dtype=torch.float64),
                      "your loss change is 0: the ablation did not change the model's output")),
    matches=lambda got, wrong: math.isclose(float(got), float(wrong), rel_tol=1e-4, abs_tol=1e-5),
)


EXERCISE = with_texts(Exercise(  # title, summaries and hints: ex16.toml
    id="ex16", chapters=("16_what_heads_learn",), preamble=PREAMBLE,
    parts=(
        Part("repeated_batch", points=2, make_cases=_batch_cases, verify=_BATCH),
        Part("induction_score", points=3, make_cases=_induction_cases, verify=_INDUCTION),
        Part("ablation_loss_change", points=3, make_cases=_ablation_cases, verify=_ABLATION),
    ),
))
