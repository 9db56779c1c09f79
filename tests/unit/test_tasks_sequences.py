"""The copy / reverse sequence tasks of chapter 1."""

import pytest
import torch

from attention_course.tasks.sequences import BOS, EOS, NUM_SPECIAL, PAD, decode, make_sequence_task


@pytest.mark.parametrize("task", ["reverse", "copy"])
def test_targets_follow_the_rule(task):
    data = make_sequence_task(300, 1, 9, task=task, num_symbols=7, seed=3)
    assert data.src.shape == (300, 9) and data.tgt_in.shape == data.tgt_out.shape == (300, 10)
    assert data.vocab_size == 7 + NUM_SPECIAL and len(data) == 300
    for row in range(300):
        length = int(data.lengths[row])
        symbols = data.src[row, :length]
        expected = symbols.flip(0) if task == "reverse" else symbols
        assert ((symbols >= NUM_SPECIAL) & (symbols < data.vocab_size)).all()
        assert (data.src[row, length:] == PAD).all()
        assert torch.equal(data.tgt_out[row, :length], expected)
        assert data.tgt_out[row, length] == EOS and (data.tgt_out[row, length + 1:] == PAD).all()
        assert data.tgt_in[row, 0] == BOS and torch.equal(data.tgt_in[row, 1:length + 1], expected)
        assert (data.tgt_in[row, length + 1:] == PAD).all()


def test_lengths_cover_the_range():
    data = make_sequence_task(2000, 4, 12, seed=0)
    assert data.lengths.min() == 4 and data.lengths.max() == 12
    assert set(data.lengths.tolist()) == set(range(4, 13))
    assert torch.equal((data.src != PAD).sum(1), data.lengths)


def test_same_seed_same_data_other_seed_other_data():
    a, b, c = (make_sequence_task(50, 3, 8, seed=s) for s in (1, 1, 2))
    assert torch.equal(a.src, b.src) and torch.equal(a.tgt_out, b.tgt_out)
    assert not torch.equal(a.src, c.src)


def test_copy_target_is_not_the_source_tensor():
    data = make_sequence_task(5, 2, 4, task="copy")
    data.tgt_out[0, 0] = 99
    assert data.src[0, 0] != 99


def test_subset():
    data = make_sequence_task(40, 2, 6, seed=0)
    short = data.subset(data.lengths <= 3)
    assert len(short) == int((data.lengths <= 3).sum()) and (short.lengths <= 3).all()
    assert torch.equal(short.src, data.src[data.lengths <= 3])


def test_decode():
    assert decode(torch.tensor([BOS, 3, 12, 5, EOS, 7])) == "092"
    assert decode([4, 5, PAD, 6]) == "12"
    assert decode([3, 15], num_symbols=20) == "0<15>"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_examples=0, min_len=1, max_len=2), "num_examples"),
        (dict(num_examples=5, min_len=4, max_len=3), "min_len must be <= max_len"),
        (dict(num_examples=5, min_len=0, max_len=3), "min_len"),
        (dict(num_examples=5, min_len=1, max_len=3, task="sort"), "task must be one of"),
        (dict(num_examples=5, min_len=1, max_len=3, num_symbols=0), "num_symbols"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_sequence_task(**kwargs)
