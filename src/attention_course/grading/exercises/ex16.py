"""Exercise 16, what heads learn: the checks behind ``exercises/ex16_what_heads_learn.ipynb``.

The learner builds a batch of repeated random tokens, the induction score of every head, the loss change
when one head of a one-layer attention-only model is zero-ablated, the direct logit attribution of a stream's
parts through a final RMSNorm frozen at its scale, the recovered share of an activation patch of one head, and
a head's OV copying score. References: the library's ``repeated_random_tokens`` and ``induction_score``, and
float64 computations written here. Mistakes recognised: halves that do not repeat, tokens not drawn as
specified, PyTorch's global generator reseeded, the earlier occurrence itself as the target, queries scored that
have no earlier occurrence (or only the first half), scores averaged per sequence, an ablation before the
softmax or without the 1/sqrt(d_head) scale, a wrong sign, attribution without the norm's scale (or with each
part's own), patches at every position or of every head, the share turned around, a copying score from W_Q or
W_K instead of W_V or without the embedding and unembedding.

Every case is built so that each known mistake's verdict on it cannot depend on the draw (the per-sequence
average meets sequences with unequal counts; a case where a mistake cannot show is marked ``credit=False``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from attention_course.grading.compare import f64
from attention_course.grading.declare import Check, Out, View, mistakes_on
from attention_course.grading.findings import FailureKind, Finding
from attention_course.grading.package_view import instructor_side
from attention_course.grading.spec import Case, Exercise, Mistake, Part, preamble, randn, with_texts

# The references run in the grader's process only: the sandbox's view of the package lacks them.
reference_induction_score = instructor_side("attention_course.interpretability", "induction_score")
reference_repeated = instructor_side("attention_course.interpretability", "repeated_random_tokens")

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


def _run_batch(obj: Any, case: Case) -> Any:
    """The learner's batch, and whether PyTorch's global random generator was left as it was (as ex13's
    sampler check does): a function that reseeds it draws the right tokens but changes the caller's
    randomness."""
    args, kwargs = case.fresh_args()
    state = torch.random.get_rng_state()
    batch = obj(*args, **kwargs)
    return batch, bool(torch.equal(torch.random.get_rng_state(), state))


def _split_batch(v: View) -> str | None:
    if not isinstance(v.output, tuple) or len(v.output) != 2 or not isinstance(v.output[1], bool):
        return "expected your function to return the batch"
    v.output, v.extra = v.output
    return None


def _global_generator_untouched(v: View) -> str | None:
    if v.extra:
        return None
    return ("your function changed PyTorch's global random generator (torch.manual_seed, or a draw without "
            "generator=...): the caller's randomness must not depend on your function; make your own "
            "torch.Generator().manual_seed(seed) and draw with generator=... only")


_BATCH = Check(
    reference=lambda v: reference_repeated(*v.args[:3], torch.Generator().manual_seed(v.args[3])),
    outputs=(Out("batch", floating=False, finite=False),),
    unpack=_split_batch,
    properties=(_halves_repeat, _token_ids, _global_generator_untouched),
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


def _per_sequence_apart(weights: torch.Tensor, tokens: torch.Tensor) -> bool:
    """Whether the per-sequence average is told apart on these inputs, whatever the draw: the sequences have
    unequal numbers of scored queries, and every head's two averages differ by more than any tolerance."""
    counts = _targets(tokens, 1).any(-1).sum(-1)
    if counts.unique().numel() < 2 or bool((counts == 0).any()):
        return False
    gap = (_per_sequence(weights, tokens) - reference_induction_score(f64(weights), tokens)).abs()
    return bool((gap > 1e-3).all())


def _unequal(g: torch.Generator, heads: int, length: int, draw_tokens: Callable[[], torch.Tensor],
             dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Random causal weights and tokens (two sequences) drawn again until the per-sequence average cannot
    pass: a case whose verdict on that mistake depended on the draw would make the notebook and the grader
    disagree."""
    while True:
        tokens = draw_tokens()
        weights = _causal_weights(g, tokens.size(0), heads, length).to(dtype)
        if _per_sequence_apart(weights, tokens):
            return weights, tokens


def _induction_cases(g: torch.Generator) -> list[Case]:
    perfect_tokens = torch.stack([torch.randperm(30, generator=g)[:6] for _ in range(3)]).repeat(1, 2)
    return [
        # Every query of a head scores the same here (1 or 0), so per-sequence averaging passes: no credit alone.
        Case("3 sequences of 2 x 6 distinct tokens: a perfect induction head, a head on the earlier occurrence, "
             "a head on the diagonal", (_induction_pattern(perfect_tokens), perfect_tokens), credit=False),
        Case("random causal weights (2, 4, 16, 16), repeated sequences of 16 token types",
             _unequal(g, 4, 16, lambda: reference_repeated(2, 8, 16, g))),
        Case("random causal weights (2, 3, 16, 16), repeated sequences of 4 token types (repeats in both halves)",
             _unequal(g, 3, 16, lambda: reference_repeated(2, 8, 4, g))),
        Case("random causal weights (2, 2, 12, 12), tokens not repeated as halves (6 token types)",
             _unequal(g, 2, 12, lambda: torch.randint(0, 6, (2, 12), generator=g))),
        Case("random causal weights (2, 2, 14, 14) in float64, a repeated sequence and one that repeats a "
             "shorter stretch (unequal numbers of repeated tokens)",
             _unequal(g, 2, 14, lambda: _uneven_repeats(g), dtype=torch.float64)),
    ]


def _uneven_repeats(g: torch.Generator) -> torch.Tensor:
    """Two sequences of 14 distinct-then-repeated tokens: one repeats 7 tokens, the other only 4."""
    first = torch.randperm(50, generator=g)[:7]
    second = torch.randperm(50, generator=g)[:10]
    return torch.stack([first.repeat(2), torch.cat([second, second[:4]])])


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


def _per_sequence(weights: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The mistake: each sequence's mean over its counted queries, then the mean over sequences ``(H,)``."""
    targets = _targets(tokens, 1)
    scored = targets.any(-1)  # (B, L)
    on_targets = (f64(weights) * targets[:, None].double()).sum(dim=-1)  # (B, H, L)
    per_sequence = (on_targets * scored[:, None].double()).sum(dim=2) / scored.sum(-1, keepdim=True).clamp(min=1)
    return per_sequence.mean(dim=0)


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
    Mistake(lambda w, t: _per_sequence(w, t),
            "you averaged each sequence's queries first and then the sequences: that weighs a sequence with few "
            "repeated tokens as much as one with many; average over every counted query of the batch at once "
            "(sum over sequences and positions, divide by the number of counted queries)"),
)


_INDUCTION = Check(
    reference=lambda v: reference_induction_score(*v.x),
    outputs=(Out("scores", "the induction score"),),
    mistakes=mistakes_on(INDUCTION_MISTAKES, lambda v: v.args),
)


# --- part 3: an ablation's loss change -----------------------------------------------------------------------
def _ablation_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, batch: int, length: int, d_model: int, heads: int, vocab: int, head: int,
             credit: bool = True) -> Case:
        d_head = d_model // heads
        while True:
            x = randn(g, batch, length, d_model)
            w_q, w_k, w_v = (randn(g, heads, d_model, d_head, scale=d_model ** -0.5 * 2) for _ in range(3))
            w_o = randn(g, heads, d_head, d_model, scale=d_head ** -0.5)
            w_u = randn(g, d_model, vocab, scale=d_model ** -0.5 * 2)
            tokens = torch.randint(0, vocab, (batch, length), generator=g)
            args = (x, w_q, w_k, w_v, w_o, w_u, tokens, head)
            # Drawn again until the scale shows (its mistake cannot pass by chance), except in the degenerate
            # case, where it never can: one key per scored query.
            if not credit or abs(_change(args, scaled=False) - _change(args)) > 1e-2:
                return Case(name, args, credit=credit)

    return [
        case("2 sequences of 6, d_model 8, 2 heads, 5 tokens: ablate head 0", 2, 6, 8, 2, 5, 0),
        case("2 sequences of 6, d_model 8, 2 heads, 5 tokens: ablate head 1", 2, 6, 8, 2, 5, 1),
        case("3 sequences of 9, d_model 12, 4 heads, 7 tokens: ablate head 2", 3, 9, 12, 4, 7, 2),
        # One prediction, from a query that sees one key: no scale, and no ablation site, can show here.
        case("1 sequence of 2 (one prediction), d_model 4, 1 head, 3 tokens: ablate head 0", 1, 2, 4, 1, 3, 0,
             credit=False),
    ]


def _logits(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, w_o: torch.Tensor,
            w_u: torch.Tensor, head: int | None, how: str = "output", scaled: bool = True) -> torch.Tensor:
    """A one-layer attention-only model in float64; ``how`` says where head ``head`` is ablated."""
    x, w_q, w_k, w_v, w_o, w_u = map(f64, (x, w_q, w_k, w_v, w_o, w_u))
    q, k, v = (torch.einsum("bld,hde->bhle", x, w) for w in (w_q, w_k, w_v))
    scores = q @ k.transpose(-2, -1) / (math.sqrt(q.size(-1)) if scaled else 1.0)  # (B, H, L, L)
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


def _change(case_args: tuple, how: str = "output", sign: float = 1.0, scaled: bool = True) -> float:
    *model, tokens, head = case_args
    clean = _loss(_logits(*model, None, scaled=scaled), tokens)
    ablated = _loss(_logits(*model, head, how, scaled=scaled), tokens)
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
              Mistake(lambda v: _change(v.args, scaled=False),
                      "your attention scores are not scaled: divide q @ kᵀ by sqrt(d_head) before the causal "
                      "softmax (d_head = W_Q.shape[-1]), in both runs"),
              Mistake(lambda v: torch.zeros((), dtype=torch.float64),
                      "your loss change is 0: the ablation did not change the model's output")),
    matches=lambda got, wrong: math.isclose(float(got), float(wrong), rel_tol=1e-4, abs_tol=1e-5),
)


# --- part 4: direct logit attribution through a frozen final norm --------------------------------------------
def _dla(parts: torch.Tensor, gain: torch.Tensor, w_u: torch.Tensor, answer: int, wrong: int, eps: float,
         scale: str = "frozen", use_gain: bool = True, sign: float = 1.0) -> torch.Tensor:
    """Each part's direct share of ``logit[answer] - logit[wrong]`` ``(P,)``, in float64; the keywords make the
    known mistakes: ``scale`` "frozen" (the whole stream's RMS), "none" or "own" (each part's own RMS)."""
    parts, gain, w_u = f64(parts), f64(gain), f64(w_u)
    direction = w_u[:, answer] - w_u[:, wrong]  # (d,)
    stream = parts.sum(dim=0)  # (d,): the final norm's input
    if scale == "frozen":
        divided = parts / (stream.pow(2).mean() + eps).sqrt()
    elif scale == "own":
        divided = parts / (parts.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()
    else:
        divided = parts
    return sign * (divided * (gain if use_gain else 1.0)) @ direction


def _dla_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, parts: int, d_model: int, vocab: int, rms: float, eps: float = 1e-5,
             dtype: torch.dtype = torch.float32) -> Case:
        while True:
            x = randn(g, parts, d_model, dtype=dtype)
            x = x * (rms / x.sum(dim=0).pow(2).mean().sqrt())  # the stream's RMS is exactly `rms`
            gain = (1 + 0.5 * randn(g, d_model)).to(dtype)
            w_u = randn(g, d_model, vocab, dtype=dtype)
            answer, wrong = (int(i) for i in torch.randperm(vocab, generator=g)[:2])
            right = _dla(x, gain, w_u, answer, wrong, eps)
            if float(right.abs().min()) > 0.05:  # no part near zero: every mistake shows on every part
                return Case(name, (x, gain, w_u, answer, wrong, eps))

    return [
        case("4 parts, d_model 8, 6 tokens, a stream of RMS 3", 4, 8, 6, 3.0),
        case("6 parts, d_model 16, 10 tokens, a stream of RMS 0.25", 6, 16, 10, 0.25),
        case("3 parts, d_model 4, 5 tokens, RMS 2, eps 0.5 (large), float64", 3, 4, 5, 2.0, eps=0.5,
             dtype=torch.float64),
    ]


def _sums_to_logit_difference(v: View) -> str | None:
    parts, gain, w_u, answer, wrong, eps = v.x
    stream = parts.sum(dim=0)
    logits = stream / (stream.pow(2).mean() + eps).sqrt() * gain @ w_u
    actual, total = float(logits[answer] - logits[wrong]), float(v.got.contributions.double().sum())
    if abs(total - actual) <= 1e-4 * (1 + abs(actual)):
        return None
    return (f"your contributions sum to {total:.4f}, but the model's logit difference is {actual:.4f}: with the "
            "norm frozen at the whole stream's scale, the parts must add up to it exactly")


_DLA = Check(
    reference=lambda v: _dla(*v.x),
    outputs=(Out("contributions", "each part divided by the whole stream's RMS, times the gain, read along the "
                                  "answer's unembedding column minus the wrong token's"),),
    mistakes=(
        Mistake(lambda v: _dla(*v.x, scale="none"),
                "you skipped the final norm's scale: divide every part by the RMS of the whole stream, "
                "sqrt(mean(x²) + eps) with x the sum of the parts, computed once (the norm frozen at its scale)"),
        Mistake(lambda v: _dla(*v.x, scale="own"),
                "you normalised each part by its own RMS: the norm divides the whole stream by one scale, so "
                "every part is divided by the RMS of their sum"),
        Mistake(lambda v: _dla(*v.x, use_gain=False),
                "you left out the norm's gain: multiply each scaled part by gain, element by element, before "
                "reading it with the unembedding"),
        Mistake(lambda v: _dla(*v.x, sign=-1.0),
                "your contributions have the wrong sign: read each part along the answer's unembedding column "
                "minus the wrong token's"),
        Mistake(lambda v: _dla(*v.x[:5], 0.0),
                "you left eps out of the scale: sqrt(mean(x²) + eps), as RMSNorm computes it"),
    ),
    explain=(_sums_to_logit_difference,),
)


# --- part 5: activation patching of one head ----------------------------------------------------------------
def _patched_logits(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, w_o: torch.Tensor,
                    w_u: torch.Tensor, heads: list[int], positions: list[int] | None,
                    source: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The one-layer model's logits ``(B, L, V)`` with ``heads``' outputs at ``positions`` (None: all) taken
    from ``source`` ``(B, H, L, d_head)``, and this run's own head outputs."""
    x, w_q, w_k, w_v, w_o, w_u = map(f64, (x, w_q, w_k, w_v, w_o, w_u))
    q, k, v = (torch.einsum("bld,hde->bhle", x, w) for w in (w_q, w_k, w_v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    allowed = torch.ones(x.size(1), x.size(1), dtype=torch.bool).tril()
    outputs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v  # (B, H, L, d_head)
    own = outputs
    if source is not None:
        outputs = outputs.clone()
        where = slice(None) if positions is None else positions
        for head in heads:
            outputs[:, head, where] = source[:, head, where]
    return (x + torch.einsum("bhle,hed->bld", outputs, w_o)) @ w_u, own


def _log_prob(logits: torch.Tensor, tokens: torch.Tensor) -> float:
    return -_loss(logits, tokens)


def _share(case_args: tuple, every_position: bool = False, every_head: bool = False,
           turned: bool = False) -> float:
    clean_x, corrupted_x, w_q, w_k, w_v, w_o, w_u, tokens, head, positions = case_args
    weights = (w_q, w_k, w_v, w_o, w_u)
    heads = list(range(w_q.size(0))) if every_head else [head]
    clean_logits, clean_outputs = _patched_logits(clean_x, *weights, heads, None, None)
    corrupted_logits, _ = _patched_logits(corrupted_x, *weights, heads, None, None)
    patched_logits, _ = _patched_logits(corrupted_x, *weights, heads, None if every_position else list(positions),
                                        clean_outputs)
    clean, corrupted, patched = (_log_prob(logits, tokens) for logits in (clean_logits, corrupted_logits,
                                                                           patched_logits))
    share = (patched - corrupted) / (clean - corrupted)
    return 1.0 - share if turned else share


def _patch_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, batch: int, length: int, d_model: int, heads: int, vocab: int, head: int,
             positions: list[int], corrupt: list[int], credit: bool = True) -> Case:
        d_head = d_model // heads
        while True:
            clean = randn(g, batch, length, d_model)
            corrupted = clean.clone()
            corrupted[:, corrupt] = randn(g, batch, len(corrupt), d_model)  # the first occurrences changed
            w_q, w_k, w_v = (randn(g, heads, d_model, d_head, scale=d_model ** -0.5 * 2) for _ in range(3))
            w_o = randn(g, heads, d_head, d_model, scale=d_head ** -0.5 * 2)
            w_u = randn(g, d_model, vocab, scale=d_model ** -0.5 * 2)
            tokens = torch.randint(0, vocab, (batch, length), generator=g)
            args = (clean, corrupted, w_q, w_k, w_v, w_o, w_u, tokens, head, positions)
            right = _share(args)
            # Drawn again until every known mistake is told apart by a clear margin (except, in the degenerate
            # case, patching every position, which is what it asks for) and the runs differ.
            wrong = [_share(args, every_head=True), _share(args, turned=True)]
            if credit:
                wrong.append(_share(args, every_position=True))
            clean_lp = _log_prob(_patched_logits(clean, *args[2:7], [head], None, None)[0], tokens)
            corrupted_lp = _log_prob(_patched_logits(corrupted, *args[2:7], [head], None, None)[0], tokens)
            if abs(clean_lp - corrupted_lp) > 0.05 and all(abs(w - right) > 1e-2 for w in wrong):
                return Case(name, args, credit=credit)

    return [
        case("2 sequences of 6, d_model 8, 2 heads: head 1 at positions [3, 4], position 0 corrupted",
             2, 6, 8, 2, 5, 1, [3, 4], [0]),
        case("3 sequences of 8, d_model 12, 3 heads: head 0 at position [5], positions 0 and 2 corrupted",
             3, 8, 12, 3, 7, 0, [5], [0, 2]),
        case("1 sequence of 7, d_model 8, 4 heads: head 2 at positions [1, 2, 3], position 1 corrupted",
             1, 7, 8, 4, 6, 2, [1, 2, 3], [1]),
        # Every position named: a patch that ignores the positions is right here, so this case earns nothing.
        case("2 sequences of 5, d_model 8, 2 heads: head 0 at every position, position 0 corrupted",
             2, 5, 8, 2, 5, 0, [0, 1, 2, 3, 4], [0], credit=False),
    ]


_PATCH = Check(
    reference=lambda v: torch.tensor(_share(v.args), dtype=torch.float64),
    outputs=(Out("recovered share", "the patched run's metric minus the corrupted run's, as a share of the clean "
                 "run's minus the corrupted run's", scalar=True, atol=1e-4, rtol=1e-3),),
    mistakes=(
        Mistake(lambda v: _share(v.args, every_position=True),
                "you overwrote the head's output at every position: restore it only at the positions given (the "
                "others keep their corrupted values)"),
        Mistake(lambda v: _share(v.args, every_head=True),
                "you restored every head at those positions: patch only the head given (its slice of the "
                "per-head outputs, before W_O sums the heads)"),
        Mistake(lambda v: _share(v.args, turned=True),
                "your share is turned around (1 minus the recovered share): measure how far the patch moves the "
                "metric from the corrupted run towards the clean one, as a share of the whole gap (1 when the "
                "patch restores everything)"),
    ),
    matches=lambda got, wrong: math.isclose(float(got), float(wrong), rel_tol=1e-3, abs_tol=1e-4),
)


# --- part 6: the OV copying score ---------------------------------------------------------------------------
def _copying(w_e: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, w_o: torch.Tensor,
             w_u: torch.Tensor, reads: str = "v", full: bool = True) -> float:
    """Σλ / Σ|λ| over the eigenvalues of ``W_E W_? W_O W_U`` (``reads`` picks W_Q, W_K or W_V)."""
    w_e, w_q, w_k, w_v, w_o, w_u = map(f64, (w_e, w_q, w_k, w_v, w_o, w_u))
    middle = {"q": w_q, "k": w_k, "v": w_v}[reads] @ w_o  # (d, d)
    circuit = w_e @ middle @ w_u if full else middle
    eigenvalues = torch.linalg.eigvals(circuit)
    return float(eigenvalues.sum().real / eigenvalues.abs().sum())


def _copying_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, vocab: int, d_model: int, d_head: int, kind: str) -> Case:
        while True:
            w_e = randn(g, vocab, d_model)
            w_q, w_k, w_v = (randn(g, d_model, d_head, scale=d_model ** -0.5) for _ in range(3))
            w_o = randn(g, d_head, d_model, scale=d_head ** -0.5)
            w_u = randn(g, d_model, vocab, scale=d_model ** -0.5)
            if kind != "random":  # tied unembedding and W_O near ±W_Vᵀ: a copier (+) or a suppressor (-)
                w_u = w_e.T.clone()
                w_o = (1.0 if kind == "copier" else -1.0) * w_v.T + 0.5 * w_o
            args = (w_e, w_q, w_k, w_v, w_o, w_u)
            right = _copying(*args)
            wrong = [_copying(*args, reads="q"), _copying(*args, reads="k"), _copying(*args, full=False)]
            if all(abs(w - right) > 0.05 for w in wrong):
                return Case(name, args)

    return [
        case("a copying head: tied unembedding, W_O near W_Vᵀ; 12 tokens, d_model 8, d_head 4", 12, 8, 4,
             "copier"),
        case("a suppressing head: W_O near -W_Vᵀ; 10 tokens, d_model 6, d_head 3", 10, 6, 3, "suppressor"),
        case("random weights: 16 tokens, d_model 8, d_head 4", 16, 8, 4, "random"),
        case("random weights: 9 tokens, d_model 12, d_head 6", 9, 12, 6, "random"),
    ]


_COPYING = Check(
    reference=lambda v: torch.tensor(_copying(*v.x), dtype=torch.float64),
    outputs=(Out("copying score", "Σλ / Σ|λ| over the eigenvalues of W_E W_V W_O W_U", scalar=True, atol=1e-6),),
    mistakes=(
        Mistake(lambda v: _copying(*v.x, reads="q"),
                "you used W_Q: what a head writes is its values' circuit, W_E W_V W_O W_U; the queries only "
                "decide where it looks"),
        Mistake(lambda v: _copying(*v.x, reads="k"),
                "you used W_K: what a head writes is its values' circuit, W_E W_V W_O W_U; the keys only decide "
                "where it looks"),
        Mistake(lambda v: _copying(*v.x, full=False),
                "you scored W_V W_O alone: the copying score is about tokens, so take the full circuit from the "
                "token embedding to the logits, W_E W_V W_O W_U"),
    ),
    matches=lambda got, wrong: math.isclose(float(got), float(wrong), rel_tol=1e-4, abs_tol=1e-5),
)


EXERCISE = with_texts(Exercise(  # title, summaries and hints: ex16.toml
    id="ex16", chapters=("16_what_heads_learn",), preamble=PREAMBLE,
    parts=(
        Part("repeated_batch", points=2, make_cases=_batch_cases, verify=_BATCH, run=_run_batch),
        Part("induction_score", points=3, make_cases=_induction_cases, verify=_INDUCTION),
        Part("ablation_loss_change", points=3, make_cases=_ablation_cases, verify=_ABLATION),
        Part("logit_attribution", points=3, make_cases=_dla_cases, verify=_DLA),
        Part("patch_recovered_share", points=3, make_cases=_patch_cases, verify=_PATCH),
        Part("copying_score", points=2, make_cases=_copying_cases, verify=_COPYING),
    ),
))
