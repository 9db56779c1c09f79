"""Additive (Bahdanau) attention."""

import pytest
import torch

from attention_course import AdditiveAttention


def test_scores_follow_the_formula():
    torch.manual_seed(0)
    attention = AdditiveAttention(query_dim=5, key_dim=3, hidden_dim=4).double()
    q = torch.randn(2, 4, 5, dtype=torch.float64)
    k = torch.randn(2, 6, 3, dtype=torch.float64)
    v = torch.randn(2, 6, 7, dtype=torch.float64)
    context, weights = attention(q, k, v)
    assert context.shape == (2, 4, 7) and weights.shape == (2, 4, 6)
    w_q, w_k, w = attention.w_q.weight, attention.w_k.weight, attention.w.weight[0]
    for b in range(2):
        for i in range(4):
            scores = torch.stack([w @ torch.tanh(w_q @ q[b, i] + w_k @ k[b, j]) for j in range(6)])
            expected = torch.softmax(scores, 0)
            torch.testing.assert_close(weights[b, i], expected, rtol=0, atol=1e-12)
            torch.testing.assert_close(context[b, i], expected @ v[b], rtol=0, atol=1e-12)


def test_mask_and_fully_masked_rows():
    torch.manual_seed(0)
    attention = AdditiveAttention(4, 4, 8)
    q, k = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    v = torch.randn(2, 5, 2, requires_grad=True)
    mask = torch.ones(2, 3, 5, dtype=torch.bool)
    mask[0, :, 3:] = False
    mask[1, 2] = False
    context, weights = attention(q, k, v, mask)
    assert (weights[0, :, 3:] == 0).all() and (weights[1, 2] == 0).all() and (context[1, 2] == 0).all()
    torch.testing.assert_close(weights[0].sum(-1), torch.ones(3))
    context.sum().backward()
    assert torch.isfinite(v.grad).all() and torch.isfinite(attention.w.weight.grad).all()


def test_score_is_bounded_by_the_l1_norm_of_w():
    torch.manual_seed(0)
    attention = AdditiveAttention(3, 2, 6)
    scores = attention.score(100 * torch.randn(7, 3), 100 * torch.randn(5, 2))
    assert scores.shape == (7, 5)
    assert scores.abs().max() <= attention.w.weight.abs().sum() + 1e-6


def test_score_names_wrong_sizes():
    attention = AdditiveAttention(3, 2, 6)
    with pytest.raises(ValueError, match=r"query must have shape \(\.\.\., Lq, query_dim=3\), got \(4, 2\)"):
        attention.score(torch.randn(4, 2), torch.randn(5, 2))
    with pytest.raises(ValueError, match=r"key must have shape \(\.\.\., Lk, key_dim=2\), got \(5,\)"):
        attention.score(torch.randn(4, 3), torch.randn(5))
