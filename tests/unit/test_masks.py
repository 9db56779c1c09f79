"""Mask builders: shapes, values, and how they broadcast against (B, H, Lq, Lk) scores."""

import pytest
import torch

from attention_course import MultiHeadAttention, causal_mask, combine_masks, padding_mask


@pytest.mark.parametrize("size", [1, 2, 5])
def test_causal_mask_is_true_on_and_below_the_diagonal(size):
    mask = causal_mask(size)
    assert mask.dtype == torch.bool and mask.shape == (size, size)
    for i in range(size):
        for j in range(size):
            assert mask[i, j].item() == (j <= i)


def test_padding_mask_shape_and_values():
    tokens = torch.tensor([[5, 6, 0, 0], [7, 0, 8, 9]])
    mask = padding_mask(tokens, pad_id=0)
    assert mask.dtype == torch.bool and mask.shape == (2, 1, 1, 4)
    assert mask[:, 0, 0].tolist() == [[True, True, False, False], [True, False, True, True]]


def test_padding_mask_hides_padded_keys_for_every_head_and_query():
    torch.manual_seed(0)
    tokens = torch.tensor([[1, 2, 3, 0, 0], [4, 5, 6, 7, 0]])
    mha = MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 5, 8)
    _, weights = mha(x, x, x, mask=padding_mask(tokens, 0))  # (2, 2, 5, 5)
    assert (weights[0, :, :, 3:] == 0).all() and (weights[1, :, :, 4] == 0).all()
    assert (weights[0, :, :, :3] > 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 5))


def test_combine_masks_gives_causal_and_padding():
    tokens = torch.tensor([[1, 2, 0], [3, 4, 5]])
    combined = combine_masks(padding_mask(tokens, 0), causal_mask(3))
    assert combined.shape == (2, 1, 3, 3)
    expected = torch.zeros(2, 1, 3, 3, dtype=torch.bool)
    for b in range(2):
        for i in range(3):
            for j in range(3):
                expected[b, 0, i, j] = j <= i and tokens[b, j] != 0
    assert torch.equal(combined, expected)
    assert combine_masks(None, None) is None
    assert torch.equal(combine_masks(None, causal_mask(3)), causal_mask(3))
