"""Chapter 2's library functions: hard and soft attention weights, attention pooling."""

from __future__ import annotations

import pytest
import torch

import attention_course as ac


def test_hard_weights_are_one_hot_at_the_argmax():
    scores = torch.tensor([[0.1, 2.0, -1.0], [5.0, 5.0, 1.0]])
    weights = ac.hard_attention_weights(scores)
    torch.testing.assert_close(weights, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


def test_hard_weights_along_another_dimension():
    scores = torch.randn(4, 6)
    weights = ac.hard_attention_weights(scores, dim=0)
    assert torch.equal(weights.sum(dim=0), torch.ones(6))
    assert torch.equal(weights.argmax(dim=0), scores.argmax(dim=0))


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0, 3.0])
def test_soft_weights_equal_torch_softmax_and_lie_on_the_simplex(beta):
    scores = torch.randn(5, 7, dtype=torch.float64) * 4
    weights = ac.soft_attention_weights(scores, beta)
    torch.testing.assert_close(weights, torch.softmax(beta * scores, dim=-1), rtol=0, atol=1e-12)
    assert (weights >= 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(5, dtype=torch.float64))


def test_soft_weights_are_uniform_at_beta_zero_and_approach_hard_weights():
    scores = torch.tensor([0.3, 1.2, -0.7, 1.0])
    torch.testing.assert_close(ac.soft_attention_weights(scores, 0.0), torch.full((4,), 0.25))
    gaps = [(ac.soft_attention_weights(scores, beta) - ac.hard_attention_weights(scores)).abs().max() for beta in (1, 10, 100)]
    assert gaps[0] > gaps[1] > gaps[2] and gaps[2] < 1e-6


def test_soft_weights_do_not_overflow():
    scores = torch.tensor([1000.0, 999.0, -1000.0])
    weights = ac.soft_attention_weights(scores, 1.0)
    assert torch.isfinite(weights).all()
    torch.testing.assert_close(weights[:2], torch.softmax(torch.tensor([1.0, 0.0]), -1), rtol=0, atol=1e-6)


@pytest.mark.parametrize("beta", [-1.0, float("inf"), float("nan")])
def test_soft_weights_reject_bad_beta(beta):
    with pytest.raises(ValueError, match="beta must be a finite number >= 0"):
        ac.soft_attention_weights(torch.randn(3), beta)


def test_weight_functions_reject_bad_scores():
    with pytest.raises(TypeError, match="floating point"):
        ac.soft_attention_weights(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="scalar"):
        ac.hard_attention_weights(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"dim 2 is out of range.*\(3,\)"):
        ac.hard_attention_weights(torch.randn(3), dim=2)
    with pytest.raises(TypeError, match="torch.Tensor"):
        ac.soft_attention_weights([1.0, 2.0])


def test_attention_pool_is_a_weighted_combination_of_rows():
    values = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])
    single = ac.attention_pool(values, torch.tensor([0.5, 0.5, 0.0]))
    torch.testing.assert_close(single, torch.tensor([0.5, 0.5]))
    many = ac.attention_pool(values, torch.eye(3))
    torch.testing.assert_close(many, values)
    batched = ac.attention_pool(values.expand(4, 3, 2), torch.full((4, 2, 3), 1 / 3))
    assert batched.shape == (4, 2, 2)
    torch.testing.assert_close(batched[0, 0], values.mean(0))


def test_attention_pool_rejects_mismatched_sizes():
    with pytest.raises(ValueError, match=r"weights have 2 entries per query but there are 3 value rows"):
        ac.attention_pool(torch.randn(3, 4), torch.randn(2))
    with pytest.raises(ValueError, match="one item per row"):
        ac.attention_pool(torch.randn(3), torch.randn(3))


def test_soft_weights_with_tied_maxima_approach_uniform_over_the_ties_not_the_argmax():
    scores = torch.tensor([4.0, 1.0, 4.0, 3.9], dtype=torch.float64)
    limit = torch.tensor([0.5, 0.0, 0.5, 0.0], dtype=torch.float64)
    gaps = [(ac.soft_attention_weights(scores, beta) - limit).abs().max() for beta in (1.0, 30.0, 300.0)]
    assert gaps[0] > gaps[1] > gaps[2] and gaps[2] < 1e-12
    # the one-hot argmax keeps the first maximum, so soft stays 0.5 away from it in the tied slots
    hard = ac.hard_attention_weights(scores)
    torch.testing.assert_close(hard, torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64))
    assert (ac.soft_attention_weights(scores, 300.0) - hard).abs().max() > 0.49
