"""Translation with a decoder-only model: source, separator and target as one sequence (chapter 13).

An encoder–decoder reads the source with one stack and writes the target with another. A decoder-only
model does both with one stack: each training example is the single sequence ::

    the black cat ate the cheese <sep> le chat noir a mangé le fromage <eos> <pad> ...
    '---------- prefix (source + <sep>) ----------'

With a **prefix mask** (:func:`~attention_course.language_model.prefix_causal_mask`) every position sees the
whole prefix, as an encoder would, and the target positions see the target causally, as a decoder would.
The loss counts the target tokens only (from the first French word to ``<eos>``): the model is asked to
translate, not to model English.

The helpers here build the joint vocabulary and the sequences, train with the same recipe as chapter 10's
encoder–decoder (Adam with the warm-up schedule, label smoothing, the same batch size), and score with the
same exact match.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from attention_course.language_model import DecoderOnlyLM, prefix_causal_mask
from attention_course.tasks.translation import SentencePair
from attention_course.training import LabelSmoothingLoss, transformer_optimizer
from attention_course.vocabulary import BOS, EOS, PAD, Vocabulary

__all__ = ["SEP", "PrefixData", "PrefixTrainingLog", "encode_prefix_pairs", "joint_vocabulary", "prefix_exact_match",
           "prefix_greedy_translate", "prefix_translation_loss", "train_prefix_translator"]

#: The separator between source and target.
SEP = "<sep>"


def joint_vocabulary(src_vocab: Vocabulary, tgt_vocab: Vocabulary) -> Vocabulary:
    """One vocabulary for both languages: ``<pad>``, ``<bos>``, ``<eos>``, ``<sep>``, English, then French words."""
    words = [w for w in src_vocab.itos if w not in src_vocab.specials]
    words += [w for w in tgt_vocab.itos if w not in tgt_vocab.specials]
    return Vocabulary(words, specials=(PAD, BOS, EOS, SEP))


@dataclass
class PrefixData:
    """Sequences ``(N, L)`` (source, ``<sep>``, target, ``<eos>``, padding) and each prefix length ``(N,)``."""

    tokens: Tensor
    prefix_lengths: Tensor
    references: list[str] = field(default_factory=list)


def encode_prefix_pairs(pairs: Sequence[SentencePair], vocab: Vocabulary) -> PrefixData:
    """Encode sentence pairs as single sequences for a decoder-only translator."""
    sep = vocab.stoi[SEP]
    rows, prefixes = [], []
    for pair in pairs:
        source = vocab.encode(pair.source, add_bos=False, add_eos=False) + [sep]
        rows.append(source + vocab.encode(pair.target, add_bos=False, add_eos=True))
        prefixes.append(len(source))
    return PrefixData(vocab.pad_batch(rows), torch.tensor(prefixes), [pair.target for pair in pairs])


def _labels(tokens: Tensor, prefix_lengths: Tensor, pad_id: int) -> Tensor:
    """Targets of positions ``0..L-2`` (the next token), with source tokens and padding set to ``pad_id``."""
    labels = tokens[:, 1:].clone()  # position t predicts token t + 1
    positions = torch.arange(1, tokens.size(1), device=tokens.device)
    labels[positions[None, :] < prefix_lengths[:, None]] = pad_id  # source tokens and <sep>: not asked for
    return labels


def prefix_translation_loss(model: DecoderOnlyLM, tokens: Tensor, prefix_lengths: Tensor, pad_id: int,
                            loss_fn: torch.nn.Module) -> Tensor:
    """The loss on the target tokens of a batch, with the prefix mask."""
    inputs = tokens[:, :-1]
    mask = prefix_causal_mask(prefix_lengths, inputs.size(1))  # (B, 1, L-1, L-1)
    logits = model(inputs, mask=mask)  # (B, L-1, V)
    labels = _labels(tokens, prefix_lengths, pad_id)
    return loss_fn(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))


@dataclass
class PrefixTrainingLog:
    """Losses per step and the wall-clock seconds of :func:`train_prefix_translator`."""

    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0


def train_prefix_translator(
    model: DecoderOnlyLM, data: PrefixData, pad_id: int, steps: int, batch_size: int = 64, warmup: int = 200,
    smoothing: float = 0.1, generator: torch.Generator | None = None, progress: Callable | None = None,
) -> PrefixTrainingLog:
    """Train with chapter 10's recipe: Adam(0.9, 0.98) with the warm-up schedule and label smoothing."""
    device = next(model.parameters()).device
    optimizer, scheduler = transformer_optimizer(model, model.d_model, warmup)
    loss_fn = LabelSmoothingLoss(smoothing, ignore_index=pad_id)
    log = PrefixTrainingLog()
    order = torch.empty(0, dtype=torch.long)
    start = time.perf_counter()
    model.train()
    for _ in progress(range(steps)) if progress is not None else range(steps):
        if order.numel() < batch_size:  # a new shuffled pass
            order = torch.randperm(data.tokens.size(0), generator=generator)
        index, order = order[:batch_size], order[batch_size:]
        tokens = data.tokens[index]
        tokens = tokens[:, : int((tokens != pad_id).sum(dim=1).max())].to(device)  # trim shared padding
        loss = prefix_translation_loss(model, tokens, data.prefix_lengths[index].to(device), pad_id, loss_fn)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        log.losses.append(loss.item())
    model.eval()
    log.seconds = time.perf_counter() - start
    return log


@torch.no_grad()
def prefix_exact_match(model: DecoderOnlyLM, data: PrefixData, pad_id: int, batch_size: int = 500) -> float:
    """Fraction of sequences whose every target token is the argmax after the reference prefix.

    As :func:`~attention_course.training.teacher_forced_exact_match` for the encoder–decoder, this equals the
    exact match of greedy decoding, in one forward pass instead of one per generated token.
    """
    model.eval()
    device = next(model.parameters()).device
    right = 0
    for start in range(0, data.tokens.size(0), batch_size):
        tokens = data.tokens[start : start + batch_size].to(device)
        prefixes = data.prefix_lengths[start : start + batch_size].to(device)
        inputs = tokens[:, :-1]
        predictions = model(inputs, mask=prefix_causal_mask(prefixes, inputs.size(1))).argmax(dim=-1)
        labels = _labels(tokens, prefixes, pad_id)
        right += int(((predictions == labels) | (labels == pad_id)).all(dim=1).sum())
    return right / data.tokens.size(0)


@torch.no_grad()
def prefix_greedy_translate(model: DecoderOnlyLM, sources: Sequence[str], vocab: Vocabulary,
                            max_len: int = 24) -> list[str]:
    """Translate English sentences greedily: feed ``source <sep>``, append the argmax until ``<eos>``.

    Each step re-runs the whole sequence with the prefix mask (the sentences are short).
    """
    model.eval()
    device = next(model.parameters()).device
    sep, eos = vocab.stoi[SEP], vocab.eos_id
    out = []
    for sentence in sources:
        prefix = vocab.encode(sentence, add_bos=False, add_eos=False) + [sep]
        tokens = torch.tensor([prefix], device=device)
        lengths = torch.tensor([len(prefix)], device=device)
        for _ in range(max_len):
            logits = model(tokens, mask=prefix_causal_mask(lengths, tokens.size(1)))
            next_token = logits[:, -1].argmax(dim=-1, keepdim=True)  # (1, 1)
            tokens = torch.cat([tokens, next_token], dim=1)
            if int(next_token) == eos or tokens.size(1) >= model.max_len:
                break
        out.append(vocab.decode(tokens[0, len(prefix):]))
    return out
