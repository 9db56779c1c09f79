"""Chapter 14's two tasks: the latest signal a few tokens back, or far back, and the recency prior."""

import pytest
import torch

from attention_course.tasks.long_context import (
    IGNORE_INDEX,
    SIGNALS,
    VOCAB,
    answer_distance,
    far_signal_batch,
    latest_signal_targets,
    recency_baseline,
    recent_signal_batch,
)


def test_targets_are_the_latest_signal_by_hand():
    noise = SIGNALS  # the first noise id
    tokens = torch.tensor([[noise, 3, noise, noise, 5, noise]])
    assert latest_signal_targets(tokens).tolist() == [[IGNORE_INDEX, 3, 3, 3, 5, 5]]
    assert answer_distance(tokens).tolist() == [[-1, 0, 1, 2, 0, 1]]
    # a window of 2 sees the signal at distance 0 and 1 only; elsewhere it guesses signal 0
    assert recency_baseline(tokens, 2).tolist() == [[0, 3, 3, 0, 5, 5]]


def test_far_signal_has_one_early_signal_and_answers_far_back():
    tokens, targets = far_signal_batch(50, 64, torch.Generator().manual_seed(0), first=4)
    signals = tokens < SIGNALS
    assert signals.sum(1).eq(1).all() and signals[:, 4:].sum() == 0
    assert ((tokens >= 0) & (tokens < VOCAB)).all()
    assert answer_distance(tokens)[:, -1].ge(60).all()
    # every target after the signal is that signal
    first = signals.float().argmax(1)
    assert torch.equal(targets[:, -1], tokens[torch.arange(50), first])
    # the recency prior is at chance (always signal 0) where the answer is beyond its window
    far = answer_distance(tokens) >= 8
    assert recency_baseline(tokens, 8)[far].eq(0).all()


def test_recent_signal_is_mostly_a_few_tokens_back_and_the_prior_solves_it():
    tokens, targets = recent_signal_batch(64, 128, torch.Generator().manual_seed(1))
    scored = targets != IGNORE_INDEX
    rate = (tokens < SIGNALS).float().mean()
    assert 0.2 < rate < 0.3
    prior = recency_baseline(tokens, 16)
    assert (prior[scored] == targets[scored]).float().mean() > 0.95


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="length"):
        far_signal_batch(2, 3, first=4)
    with pytest.raises(ValueError, match="signal_rate"):
        recent_signal_batch(2, 8, signal_rate=0.0)
    with pytest.raises(ValueError, match="window"):
        recency_baseline(torch.zeros(1, 4, dtype=torch.int64), 0)
    with pytest.raises(ValueError, match="int64"):
        latest_signal_targets(torch.zeros(4, dtype=torch.int64))
