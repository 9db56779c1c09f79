"""Draft models for speculative decoding (chapter 17).

Speculative decoding pays off when a draft call costs a small fraction ``c`` of a target call and the target
accepts most drafted tokens. Two drafts for the course model:

- :func:`truncated_draft`: the target's first ``num_layers`` blocks, its final norm and its tied unembedding
  (an "early exit" of the target, no training). It shares the vocabulary and the embedding for free, but on
  a CPU a call of a small model is mostly fixed overhead, so one block of four costs far more than a quarter
  of a call, and the first block's residual stream read through the final norm is a poor next-token predictor.
- :class:`NGramDraft`: an interpolated trigram/bigram table counted on the target's own training text
  (a lookup, no matrix product). It costs a few microseconds a call (``c`` near 0) and, on source code,
  predicts the next token well enough to be accepted often.

Both have the interface :func:`~attention_course.speculative_generate` needs from a draft:
``vocab_size``, ``max_len``, ``new_cache()`` and ``step(tokens (1, t), cache) -> logits (1, t, V)``.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from attention_course.checks import check_int
from attention_course.language_model import LMCache
from attention_course.sampling import chi_square_p_value

__all__ = ["NGramDraft", "chi_square_power", "speculative_token_distribution", "truncated_draft"]


def truncated_draft(model: nn.Module, num_layers: int) -> nn.Module:
    """A copy of ``model`` (a :class:`~attention_course.DecoderOnlyLM`) that keeps its first ``num_layers``
    blocks, then its final norm and (tied) output layer: an early exit of the target, in eval mode.

    Raises:
        ValueError: ``num_layers`` not in ``1 .. len(model.blocks)``.
    """
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise TypeError(f"model must be an attention_course.DecoderOnlyLM, got {type(model).__name__}")
    check_int("num_layers", num_layers)
    if num_layers > len(blocks):
        raise ValueError(f"num_layers must be at most the model's {len(blocks)} blocks, got {num_layers}")
    draft = copy.deepcopy(model)
    draft.blocks = nn.ModuleList(list(draft.blocks)[:num_layers])
    return draft.eval()


class NGramDraft(nn.Module):
    """A draft model that is a table: ``q(x | a, b) = λ·P_3(x | a, b) + (1 - λ)·P_2(x | b)``.

    ``P_2`` is the add-``alpha`` bigram distribution (a dense ``(V, V)`` table), ``P_3`` the maximum-likelihood
    trigram distribution of contexts seen at least ``min_count`` times (else ``λ = 0``), both counted on
    ``train_ids``. A call looks rows up; it has no cache to speak of (``LMCache`` with no layers, whose
    ``position`` it advances).

    Args:
        train_ids: ``(N,)`` int64 token ids of the training text.
        vocab_size: V.
        max_len: the longest sequence it accepts (set to the target's).
        trigram_weight: λ for contexts seen ``min_count`` times or more.
        alpha: add-alpha smoothing of the bigram.
        min_count: occurrences a two-token context needs before its trigram row is used.

    Shape: ``step(tokens (1, t), cache) -> logits (1, t, V)`` (log-probabilities).
    """

    def __init__(self, train_ids: Tensor, vocab_size: int, max_len: int = 256, trigram_weight: float = 0.7,
                 alpha: float = 0.01, min_count: int = 2) -> None:
        super().__init__()
        check_int("vocab_size", vocab_size)
        check_int("max_len", max_len)
        if not isinstance(train_ids, Tensor) or train_ids.dim() != 1 or train_ids.dtype != torch.long:
            raise ValueError("train_ids must be a (N,) int64 tensor")
        if train_ids.numel() < 3 or int(train_ids.min()) < 0 or int(train_ids.max()) >= vocab_size:
            raise ValueError(f"train_ids must hold at least 3 ids in [0, {vocab_size})")
        if not 0 <= trigram_weight <= 1:
            raise ValueError(f"trigram_weight must be in [0, 1], got {trigram_weight}")
        self.vocab_size, self.max_len = vocab_size, max_len
        self.trigram_weight, self.min_count = float(trigram_weight), min_count
        V = vocab_size
        bigram = torch.bincount(train_ids[:-1] * V + train_ids[1:], minlength=V * V).view(V, V).float()
        bigram += alpha
        self.register_buffer("bigram", bigram / bigram.sum(-1, keepdim=True), persistent=False)  # (V, V)
        # trigram rows of frequent contexts, stored sparsely: context key -> (next ids, probabilities)
        keys = (train_ids[:-2] * V + train_ids[1:-1]) * V + train_ids[2:]
        unique, counts = torch.unique(keys, return_counts=True)
        context_ids, per_context = torch.unique_consecutive(unique // V, return_counts=True)
        bounds = torch.cat([torch.zeros(1, dtype=torch.long), per_context.cumsum(0)]).tolist()
        self._rows: dict[int, tuple[Tensor, Tensor]] = {}
        for i, context in enumerate(context_ids.tolist()):
            c = counts[bounds[i] : bounds[i + 1]].float()
            if float(c.sum()) >= min_count:
                self._rows[context] = (unique[bounds[i] : bounds[i + 1]] % V, c / c.sum())

    def new_cache(self) -> LMCache:
        """A cache with no layers: only the position counts."""
        return LMCache([], 0)

    def distribution(self, previous: int, current: int | None) -> Tensor:
        """``(V,)`` the draft's probabilities of the token after ``(previous, current)`` (``previous`` may be
        None at the start of a sequence)."""
        last = current
        q = self.bigram[last].clone()
        row = self._rows.get(previous * self.vocab_size + last) if previous is not None else None
        if row is not None:
            q.mul_(1 - self.trigram_weight).index_add_(0, row[0], row[1] * self.trigram_weight)
        return q

    def step(self, tokens: Tensor, cache: LMCache) -> Tensor:
        """Log-probabilities of the next token after each of ``tokens (1, t)``; the context is the tokens given
        in this and the previous call (kept in ``cache``)."""
        if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.size(0) != 1:
            raise ValueError("tokens must be a (1, t) int64 tensor")
        # the tokens seen so far, cut back to the cache's position (speculative decoding truncates it)
        history = getattr(cache, "history", [])[: cache.position] + tokens[0].tolist()
        start = len(history) - tokens.size(1)
        rows = [self.distribution(history[i - 1] if i > 0 else None, history[i])
                for i in range(start, len(history))]
        cache.history = history
        cache.position += tokens.size(1)
        return torch.log(torch.stack(rows).clamp_min(1e-30))[None].to(tokens.device)  # (1, t, V)

    def forward(self, tokens: Tensor) -> Tensor:
        """Log-probabilities at every position of ``tokens (1, L)``: ``(1, L, V)``."""
        return self.step(tokens, self.new_cache())

    def extra_repr(self) -> str:
        return (f"vocab_size={self.vocab_size}, trigram contexts={len(self._rows)}, "
                f"trigram_weight={self.trigram_weight}, max_len={self.max_len}")



# ---------------------------------------------------------------------------------------------------------
# Checking the accept/reject rule with power
# ---------------------------------------------------------------------------------------------------------
def speculative_token_distribution(p_target: Tensor, p_draft: Tensor, residual_from_target: bool = False) -> Tensor:
    """The exact distribution of the token one round of speculative sampling emits at a drafted position.

    ``P(x) = q(x) min(1, p(x)/q(x)) + (1 - β) r(x)`` with ``β = Σ_y min(p(y), q(y))`` the acceptance
    probability and ``r`` the residual ``max(0, p - q)`` normalised, which makes ``P = p``; with
    ``residual_from_target=True``, ``r = p`` (the pitfall), which does not.

    Args:
        p_target, p_draft: ``(..., V)`` distributions.

    Returns:
        ``(..., V)`` float64.
    """
    p, q = p_target.double(), p_draft.double()
    if p.shape != q.shape:
        raise ValueError(f"p_target and p_draft must have one shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    kept = torch.minimum(p, q)  # q(x) min(1, p(x)/q(x))
    missing = 1 - kept.sum(-1, keepdim=True)
    residual = (p - q).clamp_min(0)
    residual = residual / residual.sum(-1, keepdim=True).clamp_min(1e-300)
    return kept + missing * (p if residual_from_target else residual)


def chi_square_power(expected: Tensor, actual: Tensor, draws: int, significance: float, runs: int = 2000,
                     generator: torch.Generator | None = None) -> float:
    """The share of ``runs`` simulated experiments in which the chi-square test at ``significance`` rejects
    ``expected`` when ``draws`` outcomes really come from ``actual`` (both ``(n,)`` probabilities).

    With ``actual = expected`` this is the false-alarm rate (about ``significance``); with a wrong ``actual``
    it is the test's power against that mistake.
    """
    check_int("draws", draws)
    check_int("runs", runs)
    counts = torch.distributions.Multinomial(draws, probs=actual.double()).sample((runs,)) if generator is None \
        else torch.stack([torch.bincount(torch.multinomial(actual.double(), draws, replacement=True,
                                                           generator=generator), minlength=actual.numel())
                          for _ in range(runs)]).double()
    rejected = sum(chi_square_p_value(c, expected.double() * draws) < significance for c in counts)
    return rejected / runs
