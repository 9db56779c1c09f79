"""The previous-plus-marked task of chapter 06 (attention_course.tasks.heads)."""

import pytest
import torch

from attention_course.tasks.heads import (
    IGNORE_INDEX,
    num_classes,
    previous_plus_marked,
    token_labels,
    vocab_size,
)


def test_shapes_and_ranges():
    batch = previous_plus_marked(64, 9, num_digits=7, generator=torch.Generator().manual_seed(0))
    assert batch.tokens.shape == batch.targets.shape == batch.digits.shape == (64, 9)
    assert batch.marked.shape == (64,)
    assert batch.tokens.dtype == batch.targets.dtype == torch.long
    assert int(batch.tokens.min()) >= 0 and int(batch.tokens.max()) < vocab_size(7)
    scored = batch.targets[:, 1:]
    assert int(scored.min()) >= 0 and int(scored.max()) < num_classes(7)
    assert bool((batch.targets[:, 0] == IGNORE_INDEX).all())


def test_exactly_one_marked_token_per_sequence_at_the_marked_position():
    batch = previous_plus_marked(200, 6, num_digits=5, generator=torch.Generator().manual_seed(1))
    is_marked = batch.tokens >= 5
    assert bool((is_marked.sum(dim=1) == 1).all())
    assert torch.equal(is_marked.float().argmax(dim=1), batch.marked)
    # the mark only shifts the id: removing it gives back the digits
    assert torch.equal(batch.tokens % 5, batch.digits)


def test_target_is_previous_digit_plus_marked_digit():
    batch = previous_plus_marked(50, 8, num_digits=10, generator=torch.Generator().manual_seed(2))
    for b in range(50):
        digits = batch.digits[b].tolist()
        marked_digit = digits[int(batch.marked[b])]
        for i in range(1, 8):
            assert int(batch.targets[b, i]) == digits[i - 1] + marked_digit


def test_every_position_gets_marked_and_all_sums_occur():
    batch = previous_plus_marked(2000, 5, num_digits=4, generator=torch.Generator().manual_seed(3))
    assert set(batch.marked.tolist()) == set(range(5))
    assert set(batch.targets[:, 1:].flatten().tolist()) == set(range(num_classes(4)))


def test_generator_makes_batches_reproducible():
    first = previous_plus_marked(8, 6, generator=torch.Generator().manual_seed(7))
    second = previous_plus_marked(8, 6, generator=torch.Generator().manual_seed(7))
    third = previous_plus_marked(8, 6, generator=torch.Generator().manual_seed(8))
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert not torch.equal(first.tokens, third.tokens)


def test_token_labels_mark_the_marked_digit():
    assert token_labels(torch.tensor([3, 1, 4, 11, 5]), num_digits=10) == ["3", "1", "4", "[1]", "5"]
    with pytest.raises(ValueError, match="outside"):
        token_labels(torch.tensor([3, 20]), num_digits=10)
    with pytest.raises(ValueError, match="1-D"):
        token_labels(torch.tensor([[3, 1]]), num_digits=10)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"batch_size": 0, "length": 5}, ValueError, "batch_size must be at least 1"),
        ({"batch_size": 2, "length": 1}, ValueError, "length"),
        ({"batch_size": 2, "length": 5, "num_digits": 1}, ValueError, "num_digits"),
        # A value of the wrong type is a TypeError (attention_course.checks.check_int).
        ({"batch_size": 2.0, "length": 5}, TypeError, "batch_size must be an int, got float"),
        ({"batch_size": True, "length": 5}, TypeError, "batch_size must be an int, got bool"),
    ],
)
def test_bad_arguments_raise(kwargs, error, match):
    with pytest.raises(error, match=match):
        previous_plus_marked(**kwargs)
