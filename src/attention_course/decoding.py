"""Turning a trained encoder–decoder into a translator: greedy decoding and beam search (chapter 10).

Both work with any model that has the two methods of :class:`~attention_course.Transformer`:

- ``model.encode(src (B, Ls), src_mask) -> memory (B, Ls, d_model)``, run once per sentence;
- ``model.decode(tgt (B, t), memory, tgt_mask, memory_mask) -> logits (B, t, vocab)``, run once per new
  token on the whole prefix generated so far (position ``t - 1`` of the logits predicts the next token).

Neither caches anything between steps: every step re-runs the decoder on the full prefix, which costs
O(t²) work per sentence. Chapter 11 removes that cost with a key–value cache.

Decoded sequences start with ``bos_id``. A sequence that has produced ``eos_id`` is finished: the positions
after its eos hold ``pad_id`` (or ``eos_id`` again when no ``pad_id`` is given) and are ignored by
:func:`sequence_log_probs`. Greedy decoding stops when every sequence is finished or after ``max_len`` new
tokens; beam search when no live prefix can beat the best finished hypothesis, or after ``max_len``.

Call ``model.eval()`` first: decoding in training mode would apply dropout.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attention_course.checks import check_decoding_args, check_int
from attention_course.masks import causal_mask, source_mask

__all__ = ["beam_search", "greedy_decode", "length_penalty_factor", "sequence_log_probs"]


@torch.no_grad()
def greedy_decode(
    model: nn.Module,
    src: Tensor,
    max_len: int,
    bos_id: int,
    eos_id: int,
    pad_id: int | None = None,
    src_mask: Tensor | None = None,
) -> Tensor:
    """Translate by taking the most probable next token at every step.

    Args:
        model: an encoder–decoder with ``encode`` and ``decode`` (see the module docstring).
        src: ``(B, Ls)`` source token ids.
        max_len: the most tokens to generate after bos (eos included).
        bos_id, eos_id: ids of the start and end tokens.
        pad_id: the padding id. It builds the source padding mask (when ``src_mask`` is None) and fills the
            positions after a sequence's eos. None: no source mask, and eos fills those positions.
        src_mask: an explicit source mask broadcastable to ``(B, H, 1, Ls)``, True = may attend.

    Returns:
        ``(B, T)`` token ids with ``T <= max_len + 1``, each row starting with ``bos_id``.
    """
    check_decoding_args(src, max_len, bos_id, eos_id)
    src_mask = source_mask(src, pad_id, src_mask)
    fill = eos_id if pad_id is None else pad_id
    memory = model.encode(src, src_mask)  # (B, Ls, d_model), computed once
    tokens = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
    finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)  # (B,)
    for _ in range(max_len):
        logits = model.decode(tokens, memory, causal_mask(tokens.size(1), device=src.device), src_mask)
        next_token = logits[:, -1].argmax(dim=-1)  # (B,): the last position predicts the next token
        next_token = next_token.masked_fill(finished, fill)  # finished rows only pad
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)  # (B, t + 1)
        finished |= next_token == eos_id
        if bool(finished.all()):
            break
    return tokens


def _generated_length(tokens: Tensor, eos_id: int) -> Tensor:
    """``(N, T)`` -> ``(N,)`` number of tokens after bos up to and including the first eos (or all of them)."""
    is_eos = tokens[:, 1:] == eos_id  # (N, T - 1)
    first_eos = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1), tokens.size(1) - 1)
    return torch.where(is_eos.any(dim=1), first_eos + 1, first_eos)


def length_penalty_factor(length: Tensor | float, alpha: float) -> Tensor | float:
    """The length penalty of Wu et al. (2016): ``lp = ((5 + length) / 6) ** alpha``.

    A hypothesis of ``length`` generated tokens (eos included) and log-probability ``s`` scores ``s / lp``.
    ``alpha = 0`` gives ``lp = 1``: plain log-probability, which favours short outputs.
    """
    return ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()
def beam_search(
    model: nn.Module,
    src: Tensor,
    beam_size: int,
    max_len: int,
    bos_id: int,
    eos_id: int,
    pad_id: int | None = None,
    src_mask: Tensor | None = None,
    length_penalty: float = 0.0,
) -> Tensor:
    """Translate with beam search as in Wu et al. (2016) and the Transformer paper; return the best output.

    The search keeps two sets per sentence (the whole batch is searched at once, as ``B * beam_size`` rows):

    - ``beam_size`` **live** prefixes, which have not produced eos. At each step every live prefix is
      extended by every token, and of the ``2 * beam_size`` extensions with the highest log-probability,
      those that end in eos become finished, and the best ``beam_size`` of the others stay live. (Among
      ``2k`` candidates at most ``k`` end in eos, so ``k`` live ones always remain.)
    - the **finished** hypotheses, compared by their length-normalised score ``log p / lp`` with
      ``lp = ((5 + length) / 6) ** length_penalty``, where ``length`` counts the generated tokens, eos
      included. Only the best finished hypothesis is needed, so only it is kept.

    Finished hypotheses never take a live slot, so a longer hypothesis whose normalised score is better
    is not pruned by shorter ones that compete on raw log-probability. The search stops for a sentence
    when no live prefix can still beat its best finished hypothesis: a live prefix's log-probability
    ``s <= 0`` can only fall, and ``lp`` is largest at ``max_len``, so ``s / lp(max_len)`` bounds
    everything it can still become. After ``max_len`` new tokens the live prefixes compete as they are
    (cut at ``max_len``, without eos). With a beam wide enough to keep every prefix, the search is exact:
    it returns the sequence with the best normalised score.

    With ``beam_size=1`` and ``length_penalty=0`` the result is at least as probable as
    :func:`greedy_decode`'s: the greedy path stays live, and a finished hypothesis met on the way wins
    only if it is more probable.

    Args:
        model, src, max_len, bos_id, eos_id, pad_id, src_mask: as for :func:`greedy_decode`.
        beam_size: live prefixes kept per sentence.
        length_penalty: the exponent ``alpha`` of the length penalty (0: none; the paper uses 0.6).

    Returns:
        ``(B, T)`` token ids of the best hypothesis per sentence, starting with ``bos_id``; after eos,
        ``pad_id`` (or ``eos_id``).
    """
    check_decoding_args(src, max_len, bos_id, eos_id)
    check_int("beam_size", beam_size)
    if not length_penalty >= 0:
        raise ValueError(f"length_penalty must be >= 0, got {length_penalty!r}")
    src_mask = source_mask(src, pad_id, src_mask)
    fill = eos_id if pad_id is None else pad_id
    batch, k, device = src.size(0), beam_size, src.device

    memory = model.encode(src, src_mask).repeat_interleave(k, dim=0)  # (B*k, Ls, d_model)
    if src_mask is not None and src_mask.dim() == 4 and src_mask.size(0) == batch and batch > 1:
        src_mask = src_mask.repeat_interleave(k, dim=0)  # (B*k, 1, 1, Ls)
    tokens = torch.full((batch * k, 1), bos_id, dtype=torch.long, device=device)  # (B*k, 1)
    # Only the first beam is alive at the start: k copies of bos would fill the beam with duplicates.
    scores = torch.full((batch, k), float("-inf"), device=device)  # raw log-probs of the live prefixes
    scores[:, 0] = 0.0
    row_offset = torch.arange(batch, device=device)[:, None] * k  # (B, 1): first row of each sentence
    best_score = torch.full((batch,), float("-inf"), device=device)  # best finished, normalised
    best_tokens = torch.full((batch, max_len + 1), fill, dtype=torch.long, device=device)
    best_tokens[:, 0] = bos_id
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    bound_lp = length_penalty_factor(float(max_len), length_penalty)

    for step in range(1, max_len + 1):  # step = generated length after this step, eos included
        logits = model.decode(tokens, memory, causal_mask(tokens.size(1), device=device), src_mask)
        log_probs = torch.log_softmax(logits[:, -1].float(), dim=-1)  # (B*k, V)
        vocab = log_probs.size(-1)
        candidates = (scores.view(-1, 1) + log_probs).view(batch, k * vocab)  # (B, k*V)
        top_scores, top_index = candidates.topk(min(2 * k, k * vocab), dim=-1)  # (B, 2k), sorted
        top_parent = row_offset + top_index // vocab  # (B, 2k): the row each candidate extends
        top_token = top_index % vocab
        ends = (top_token == eos_id) & torch.isfinite(top_scores)

        # Finished candidates: compare their normalised scores with the best finished so far.
        normalised = top_scores / length_penalty_factor(float(step), length_penalty)
        normalised = torch.where(ends, normalised, float("-inf"))
        new_best, which = normalised.max(dim=-1)  # (B,)
        improves = (new_best > best_score) & ~done
        if bool(improves.any()):
            parent = top_parent.gather(1, which[:, None])[:, 0]  # (B,)
            finished = torch.cat([tokens[parent], torch.full_like(parent, eos_id)[:, None]], dim=1)
            best_tokens[improves, : step + 1] = finished[improves]
            best_score = torch.where(improves, new_best, best_score)

        # Live candidates: the best k extensions that do not end in eos.
        live_scores = torch.where(top_token == eos_id, float("-inf"), top_scores)
        scores, pick = live_scores.topk(k, dim=-1)  # (B, k)
        parent = top_parent.gather(1, pick).view(-1)  # (B*k,)
        tokens = torch.cat([tokens[parent], top_token.gather(1, pick).view(-1, 1)], dim=1)

        # Stop a sentence when no live prefix can beat its best finished hypothesis.
        bound = scores.max(dim=-1).values / bound_lp  # (B,)
        done |= best_score >= bound
        if bool(done.all()):
            break
    else:  # max_len reached: the live prefixes, cut without eos, compete as they are
        cut = scores / length_penalty_factor(float(max_len), length_penalty)  # (B, k)
        cut_best, which = cut.max(dim=-1)
        improves = (cut_best > best_score) & ~done
        rows = (row_offset[:, 0] + which)[improves]
        best_tokens[improves] = tokens[rows]
        best_score = torch.where(improves, cut_best, best_score)

    # Drop the columns after the longest returned hypothesis (only filler there).
    length = int(_generated_length(best_tokens, eos_id).max()) + 1
    return best_tokens[:, :length]


@torch.no_grad()
def sequence_log_probs(
    model: nn.Module,
    src: Tensor,
    tokens: Tensor,
    eos_id: int,
    pad_id: int | None = None,
    src_mask: Tensor | None = None,
) -> Tensor:
    """Log-probability the model gives to each decoded sequence: ``Σ_t log p(y_t | y_<t, x)``.

    Args:
        model, src, pad_id, src_mask: as for :func:`greedy_decode`.
        tokens: ``(B, T)`` sequences starting with bos, as returned by the decoders. The sum runs over the
            tokens after bos up to and including the first eos; later positions are ignored.

    Returns:
        ``(B,)`` log-probabilities (natural log, float32 or the logits' dtype if wider).
    """
    if tokens.dim() != 2 or tokens.size(0) != src.size(0) or tokens.size(1) < 2:
        raise ValueError(f"tokens must be (batch={src.size(0)}, T >= 2) sequences starting with bos, got "
                         f"{tuple(tokens.shape)}")
    src_mask = source_mask(src, pad_id, src_mask)
    memory = model.encode(src, src_mask)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # teacher forcing: predict token t from tokens < t
    logits = model.decode(inputs, memory, causal_mask(inputs.size(1), device=src.device), src_mask)
    log_probs = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    token_log_probs = log_probs.gather(-1, targets[..., None])[..., 0]  # (B, T - 1)
    lengths = _generated_length(tokens, eos_id)  # (B,)
    counted = torch.arange(targets.size(1), device=src.device)[None, :] < lengths[:, None]
    return torch.where(counted, token_log_probs, 0.0).sum(dim=-1)
