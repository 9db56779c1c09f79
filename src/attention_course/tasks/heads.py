"""A task that needs two attention heads doing two different jobs (chapter 06).

Each sequence is ``length`` digits from ``0 .. num_digits - 1``; exactly one position is **marked**. The
target at position ``i >= 1`` is

    target[i] = digit[i - 1] + digit[marked]          (an integer in 0 .. 2 * num_digits - 2)

so every output needs two things from elsewhere in the sequence: the digit just before it (a job defined
by *position*) and the marked digit (a job defined by *content*, wherever it sits). Position 0 has no
previous digit; its target is :data:`IGNORE_INDEX`, which ``torch.nn.functional.cross_entropy`` skips.

Token ids: an ordinary digit ``d`` is id ``d``; the marked digit ``d`` is id ``num_digits + d``, so the
vocabulary has ``2 * num_digits`` ids and the mark is visible in the token itself.

Example (``num_digits = 10``)::

    digits   3  1  4  1  5            marked position 3 (the second 1)
    tokens   3  1  4 11  5
    targets  -  4  2  5  2            (3+1, 1+1, 4+1, 1+1)
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from attention_course.checks import check_int

__all__ = ["IGNORE_INDEX", "HeadsTaskBatch", "num_classes", "previous_plus_marked", "token_labels", "vocab_size"]

#: Target value for positions without a defined answer (position 0); ``F.cross_entropy`` ignores it.
IGNORE_INDEX = -100


class HeadsTaskBatch(NamedTuple):
    """One batch of the previous-plus-marked task.

    Attributes:
        tokens: ``(B, L)`` token ids in ``0 .. 2 * num_digits - 1``.
        targets: ``(B, L)`` class ids in ``0 .. 2 * num_digits - 2``; column 0 is :data:`IGNORE_INDEX`.
        marked: ``(B,)`` the marked position of each sequence.
        digits: ``(B, L)`` the digits without the mark, in ``0 .. num_digits - 1``.
    """

    tokens: Tensor
    targets: Tensor
    marked: Tensor
    digits: Tensor


def vocab_size(num_digits: int) -> int:
    """Number of token ids: each digit, plain and marked."""
    check_int("num_digits", num_digits, 2)
    return 2 * num_digits


def num_classes(num_digits: int) -> int:
    """Number of target classes: the sums ``0 .. 2 * (num_digits - 1)``."""
    check_int("num_digits", num_digits, 2)
    return 2 * num_digits - 1


def previous_plus_marked(
    batch_size: int,
    length: int,
    num_digits: int = 10,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> HeadsTaskBatch:
    """Sample a batch of the previous-plus-marked task.

    Args:
        batch_size: number of sequences B.
        length: sequence length L (at least 2, so that some position has a previous digit).
        num_digits: digits are ``0 .. num_digits - 1``.
        generator: torch generator for reproducible batches (sampling happens on the CPU).
        device: where the returned tensors live.

    Returns:
        A :class:`HeadsTaskBatch` of ``(B, L)`` tokens, targets and digits and ``(B,)`` marked positions.

    Raises:
        ValueError: an argument is not an int in its allowed range.
    """
    check_int("batch_size", batch_size, 1)
    check_int("length", length, 2)
    check_int("num_digits", num_digits, 2)
    digits = torch.randint(num_digits, (batch_size, length), generator=generator)  # (B, L)
    marked = torch.randint(length, (batch_size,), generator=generator)  # (B,)
    rows = torch.arange(batch_size)
    tokens = digits.clone()
    tokens[rows, marked] += num_digits  # the marked digit d becomes id num_digits + d
    marked_digit = digits[rows, marked].unsqueeze(1)  # (B, 1)
    targets = torch.full_like(digits, IGNORE_INDEX)
    targets[:, 1:] = digits[:, :-1] + marked_digit  # (B, L - 1): previous digit + marked digit
    return HeadsTaskBatch(tokens.to(device), targets.to(device), marked.to(device), digits.to(device))


def token_labels(tokens: Tensor, num_digits: int = 10) -> list[str]:
    """Readable labels for one sequence of token ids, e.g. ``["3", "1", "4", "[1]", "5"]`` (marked in brackets).

    Args:
        tokens: ``(L,)`` token ids of one sequence.
        num_digits: the ``num_digits`` the tokens were made with.

    Raises:
        ValueError: ``tokens`` is not 1-D or holds an id outside ``0 .. 2 * num_digits - 1``.
    """
    if not isinstance(tokens, Tensor) or tokens.dim() != 1:
        shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"tokens must be a 1-D tensor (one sequence), got {shape}")
    ids = tokens.tolist()
    bad = [i for i in ids if not 0 <= i < vocab_size(num_digits)]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside 0 .. {vocab_size(num_digits) - 1} for num_digits={num_digits}")
    return [f"[{i - num_digits}]" if i >= num_digits else str(i) for i in ids]
