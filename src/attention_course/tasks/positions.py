"""A task that cannot be solved without positions (chapter 07): copy the token ``shift`` places back.

Each sequence is ``length`` random tokens from ``0 .. vocab_size - 1``, and the target at position ``i`` is

    target[i] = token[i - shift]          for i >= shift
    target[i] = IGNORE_INDEX              for i <  shift (nothing to copy; ``F.cross_entropy`` skips it)

Self-attention without positional information (and without a causal mask) treats the tokens as a set, so it
cannot know which token came ``shift`` places earlier. With positions the job is one attention
head looking ``shift`` places back. Because the rule is the same at every position, the task also tests
whether a model trained on short sequences still works at positions it never saw (length extrapolation).

Example (``shift = 1``)::

    tokens   7  2  2  5  0
    targets  -  7  2  2  5
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from attention_course.checks import check_int

__all__ = ["IGNORE_INDEX", "ShiftBatch", "accuracy_by_position", "shifted_copy"]

#: Target value for positions without an answer; ``torch.nn.functional.cross_entropy`` ignores it.
IGNORE_INDEX = -100


class ShiftBatch(NamedTuple):
    """One batch of the shifted-copy task.

    Attributes:
        tokens: ``(B, L)`` token ids in ``0 .. vocab_size - 1``.
        targets: ``(B, L)``; ``targets[:, i] = tokens[:, i - shift]``, and :data:`IGNORE_INDEX` for ``i < shift``.
    """

    tokens: Tensor
    targets: Tensor


def shifted_copy(
    batch_size: int,
    length: int,
    vocab_size: int = 10,
    shift: int = 1,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> ShiftBatch:
    """Sample a batch of the shifted-copy task.

    Args:
        batch_size: number of sequences B.
        length: sequence length L; must exceed ``shift`` so that some position has a target.
        vocab_size: tokens are ``0 .. vocab_size - 1`` (at least 2).
        shift: how many places back the answer sits (at least 1).
        generator: torch generator for reproducible batches (sampling happens on the CPU).
        device: where the returned tensors live.

    Returns:
        A :class:`ShiftBatch` with ``(B, L)`` tokens and targets.

    Raises:
        ValueError: an argument is not an int in its allowed range, or ``length <= shift``.
    """
    check_int("batch_size", batch_size, 1)
    check_int("vocab_size", vocab_size, 2)
    check_int("shift", shift, 1)
    check_int("length", length, 1)
    if length <= shift:
        raise ValueError(f"length={length} must exceed shift={shift}, or no position has a target")
    tokens = torch.randint(vocab_size, (batch_size, length), generator=generator)  # (B, L)
    targets = torch.full_like(tokens, IGNORE_INDEX)
    targets[:, shift:] = tokens[:, :-shift]  # position i copies position i - shift
    return ShiftBatch(tokens.to(device), targets.to(device))


def accuracy_by_position(logits: Tensor, targets: Tensor) -> Tensor:
    """Fraction of correct predictions at each position, over the batch.

    Args:
        logits: ``(B, L, C)`` class scores.
        targets: ``(B, L)`` class ids, :data:`IGNORE_INDEX` where there is no answer.

    Returns:
        ``(L,)`` float tensor; NaN at positions where every target is :data:`IGNORE_INDEX`.

    Raises:
        ValueError: the shapes do not fit together.
    """
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(
            f"expected logits (B, L, C) and targets (B, L), got {tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    valid = targets != IGNORE_INDEX  # (B, L)
    correct = (logits.argmax(dim=-1) == targets) & valid  # (B, L)
    counts = valid.sum(dim=0).to(torch.float32)  # (L,)
    return correct.sum(dim=0).to(torch.float32) / counts  # 0 / 0 = NaN where nothing is scored
