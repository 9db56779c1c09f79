"""The shifted-copy task of chapter 07 (attention_course.tasks.positions)."""

import math

import pytest
import torch

from attention_course.tasks.positions import IGNORE_INDEX, accuracy_by_position, shifted_copy


@pytest.mark.parametrize("shift", [1, 3])
def test_targets_copy_the_token_shift_places_back(shift):
    batch = shifted_copy(16, 10, vocab_size=7, shift=shift, generator=torch.Generator().manual_seed(0))
    assert batch.tokens.shape == batch.targets.shape == (16, 10)
    assert int(batch.tokens.min()) >= 0 and int(batch.tokens.max()) < 7
    assert bool((batch.targets[:, :shift] == IGNORE_INDEX).all())
    for i in range(shift, 10):
        assert torch.equal(batch.targets[:, i], batch.tokens[:, i - shift])


def test_generator_makes_batches_reproducible():
    first = shifted_copy(4, 6, generator=torch.Generator().manual_seed(5))
    second = shifted_copy(4, 6, generator=torch.Generator().manual_seed(5))
    assert torch.equal(first.tokens, second.tokens) and torch.equal(first.targets, second.targets)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"batch_size": 2, "length": 3, "shift": 3}, "must exceed shift"),
        ({"batch_size": 2, "length": 3, "shift": 0}, "shift"),
        ({"batch_size": 0, "length": 3}, "batch_size"),
        ({"batch_size": 2, "length": 3, "vocab_size": 1}, "vocab_size"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        shifted_copy(**kwargs)


def test_accuracy_by_position_counts_correct_predictions_per_column():
    targets = torch.tensor([[IGNORE_INDEX, 1, 2], [IGNORE_INDEX, 0, 2]])
    logits = torch.zeros(2, 3, 3)
    logits[0, 1, 1] = logits[1, 1, 2] = 1.0  # position 1: one right, one wrong
    logits[:, 2, 2] = 1.0  # position 2: both right
    accuracy = accuracy_by_position(logits, targets)
    assert math.isnan(accuracy[0].item())
    assert accuracy[1:].tolist() == [0.5, 1.0]


def test_accuracy_by_position_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="expected logits"):
        accuracy_by_position(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))
