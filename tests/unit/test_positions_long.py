"""Tests of chapter 14's library: rotary position embedding, ALiBi, and MultiHeadAttention's position schemes."""

from __future__ import annotations

import math

import pytest
import torch

import attention_course as ac


def test_apply_rotary_rotates_each_pair_by_position_times_frequency():
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    positions = torch.tensor([0.0, 1.0, 2.0, 7.0, 100.0], dtype=torch.float64)
    rotated = ac.apply_rotary(x, positions)
    for i in range(4):
        angle = positions * 10000.0 ** (-2 * i / 8)  # (5,)
        even, odd = x[..., 2 * i], x[..., 2 * i + 1]
        torch.testing.assert_close(rotated[..., 2 * i], even * angle.cos() - odd * angle.sin())
        torch.testing.assert_close(rotated[..., 2 * i + 1], even * angle.sin() + odd * angle.cos())


def test_apply_rotary_defaults_to_arange_keeps_norms_and_position_zero():
    x = torch.randn(2, 4, 7, 6, dtype=torch.float64)
    rotated = ac.apply_rotary(x)
    torch.testing.assert_close(rotated, ac.apply_rotary(x, torch.arange(7)))
    torch.testing.assert_close(rotated[..., 0, :], x[..., 0, :])  # position 0: no rotation
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))  # a rotation keeps lengths
    assert not torch.allclose(rotated[..., 1:, :], x[..., 1:, :])


def test_rotary_scores_depend_on_offset_only():
    q, k = torch.randn(1, 6, 16, dtype=torch.float64), torch.randn(1, 6, 16, dtype=torch.float64)
    base_scores = ac.apply_rotary(q) @ ac.apply_rotary(k).transpose(-2, -1)
    for shift in (3, 250, 10_000):
        positions = torch.arange(6) + shift
        shifted = ac.apply_rotary(q, positions) @ ac.apply_rotary(k, positions).transpose(-2, -1)
        torch.testing.assert_close(shifted, base_scores, rtol=0, atol=1e-9)


def test_rotary_matches_chapter_07_sinusoid_rotation():
    # Rotating the vector (0, 1) in every pair by position p gives (-sin, cos); chapter 07's table has (sin, cos).
    d, length = 10, 9
    unit = torch.zeros(length, d, dtype=torch.float64)
    unit[:, 1::2] = 1.0
    rotated = ac.apply_rotary(unit)
    table = ac.sinusoidal_positional_encoding(length, d, dtype=torch.float64)
    torch.testing.assert_close(rotated[:, 0::2], -table[:, 0::2])
    torch.testing.assert_close(rotated[:, 1::2], table[:, 1::2])


def test_apply_rotary_rejects_bad_input():
    with pytest.raises(ValueError, match="even feature size.*d=5"):
        ac.apply_rotary(torch.randn(2, 3, 5))
    with pytest.raises(TypeError, match="floating-point"):
        ac.apply_rotary(torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="do not broadcast"):
        ac.apply_rotary(torch.randn(2, 3, 4), torch.arange(5))
    with pytest.raises(ValueError, match="base must be a number greater than 1"):
        ac.apply_rotary(torch.randn(2, 3, 4), base=1.0)


def test_alibi_slopes_powers_of_two_and_the_papers_rule():
    torch.testing.assert_close(ac.alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    torch.testing.assert_close(ac.alibi_slopes(4), torch.tensor([2.0 ** (-2 * (i + 1)) for i in range(4)]))
    # 6 heads: the 4 slopes of 4 heads, then slopes 1 and 3 (0-based 0 and 2) of the 8-head sequence.
    torch.testing.assert_close(ac.alibi_slopes(6), torch.tensor([1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]))
    assert ac.alibi_slopes(1).tolist() == [2.0 ** -8]
    assert len(set(ac.alibi_slopes(12).tolist())) == 12


def test_alibi_bias_is_minus_slope_times_distance():
    bias = ac.alibi_bias(4, 5)
    slopes = ac.alibi_slopes(4)
    assert bias.shape == (4, 5, 5)
    for h in range(4):
        for i in range(5):
            for j in range(5):
                assert math.isclose(float(bias[h, i, j]), -float(slopes[h]) * abs(i - j), rel_tol=1e-6)
    rectangular = ac.alibi_bias(2, 1, 6)  # one query, the newest position, against 6 keys
    torch.testing.assert_close(rectangular[:, 0], -ac.alibi_slopes(2)[:, None] * torch.arange(5, -1, -1.0))


def test_alibi_rejects_bad_input():
    with pytest.raises(ValueError, match="num_heads must be at least 1, got 0"):
        ac.alibi_slopes(0)
    with pytest.raises(TypeError, match="length_q must be an int"):
        ac.alibi_bias(2, 3.0)


@pytest.mark.parametrize("positions", [None, "rotary", "alibi"])
def test_attention_with_positions_equals_manual_computation(positions):
    torch.manual_seed(0)
    attention = ac.MultiHeadAttention(16, 4, config=ac.ModelConfig(positions=positions)).double().eval()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    output, weights = attention(x, x, x, mask=ac.causal_mask(7))
    q = attention.split_heads(attention.w_q(x))
    k = attention.split_heads(attention.w_k(x))
    v = attention.split_heads(attention.w_v(x))
    scores = q @ k.transpose(-2, -1) / 2.0
    if positions == "rotary":
        scores = ac.apply_rotary(q) @ ac.apply_rotary(k).transpose(-2, -1) / 2.0
    if positions == "alibi":
        scores = scores + ac.alibi_bias(4, 7).double()
    expected_weights = ac.masked_softmax(scores, ac.causal_mask(7))
    torch.testing.assert_close(weights, expected_weights)
    torch.testing.assert_close(output, attention.w_o(attention.merge_heads(expected_weights @ v)))


def test_rotary_attention_is_shift_invariant_alibi_too():
    torch.manual_seed(1)
    x = torch.randn(1, 9, 16, dtype=torch.float64)
    for positions in ("rotary", "alibi"):
        attention = ac.MultiHeadAttention(16, 2, config=ac.ModelConfig(positions=positions)).double().eval()
        keys, values = attention.project_kv(x, x, torch.arange(9) + 40)
        shifted, _ = attention.attend(x, keys, values, query_positions=torch.arange(9) + 40,
                                      key_positions=torch.arange(9) + 40)
        torch.testing.assert_close(shifted, attention(x, x, x)[0])


def test_multihead_rejects_unknown_positions_and_odd_rotary_heads():
    with pytest.raises(ValueError, match="positions must be one of"):
        ac.MultiHeadAttention(16, 4, config=ac.ModelConfig(positions="learned"))
    with pytest.raises(ValueError, match="even d_head"):
        ac.MultiHeadAttention(12, 4, config=ac.ModelConfig(positions="rotary"))
