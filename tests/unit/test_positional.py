"""Sinusoidal and learned positional encodings."""

import math

import pytest
import torch

from attention_course import (
    EncoderLayer,
    LearnedPositionalEmbedding,
    PositionalEncoding,
    sinusoidal_positional_encoding,
)


def test_sinusoid_formula():
    pe = sinusoidal_positional_encoding(50, 16, dtype=torch.float64)
    assert pe.shape == (50, 16) and pe.dtype == torch.float64
    for p in (0, 1, 7, 49):
        for i in range(8):
            angle = p / 10000 ** (2 * i / 16)
            assert pe[p, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-12)
            assert pe[p, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-12)
    assert torch.equal(pe[0], torch.tensor([0.0, 1.0] * 8, dtype=torch.float64))
    assert sinusoidal_positional_encoding(4, 6).dtype == torch.get_default_dtype()


def _rotation(k, d_model):
    """Block-diagonal R_k with PE[p + k] = R_k PE[p] (column-vector form): one 2x2 rotation per frequency."""
    rotation = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i in range(d_model // 2):
        theta = k / 10000 ** (2 * i / d_model)
        c, s = math.cos(theta), math.sin(theta)
        # [sin(a + t), cos(a + t)] = [[c, s], [-s, c]] @ [sin a, cos a]
        rotation[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, s], [-s, c]], dtype=torch.float64)
    return rotation


@pytest.mark.parametrize("k", [1, 5, 17])
def test_shifting_position_is_a_fixed_rotation(k):
    pe = sinusoidal_positional_encoding(64, 16, dtype=torch.float64)
    rotation = _rotation(k, 16)
    torch.testing.assert_close(pe[k:], pe[:-k] @ rotation.T, rtol=0, atol=1e-10)


def test_dot_products_depend_only_on_the_offset():
    pe = sinusoidal_positional_encoding(100, 32, dtype=torch.float64)
    gram = pe @ pe.T
    for offset in (0, 1, 3, 10):
        diagonal = torch.diagonal(gram, offset=offset)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), rtol=0, atol=1e-10)
    torch.testing.assert_close(torch.diagonal(gram), torch.full((100,), 16.0, dtype=torch.float64))


def test_positional_encoding_module_adds_the_table():
    module = PositionalEncoding(8, max_len=20, dropout=0.1).eval()
    x = torch.randn(2, 5, 8)
    table = sinusoidal_positional_encoding(20, 8)
    torch.testing.assert_close(module(x), x + table[:5], rtol=0, atol=0)
    torch.testing.assert_close(module(x, offset=3), x + table[3:8], rtol=0, atol=0)
    assert "pe" not in module.state_dict()  # a fixed table, not trained or saved
    module.train()
    torch.manual_seed(0)
    dropped = module(torch.ones(4, 20, 8))
    assert 0.05 < (dropped == 0).float().mean().item() < 0.15


def test_learned_positional_embedding():
    module = LearnedPositionalEmbedding(10, 4, dropout=0.0)
    x = torch.randn(3, 6, 4)
    torch.testing.assert_close(module(x), x + module.embedding.weight[:6], rtol=0, atol=0)
    module(x).sum().backward()
    grad = module.embedding.weight.grad
    assert (grad[:6] != 0).all() and (grad[6:] == 0).all()


def test_positions_break_permutation_equivariance():
    torch.manual_seed(0)
    layer = EncoderLayer(16, 2, 32, dropout=0.0).double().eval()
    positions = PositionalEncoding(16, max_len=10, dropout=0.0).double()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    # without positions the layer cannot tell the order: permuting inputs permutes outputs
    torch.testing.assert_close(layer(x[:, perm]), layer(x)[:, perm], rtol=0, atol=1e-10)
    # with positions added, the same permutation gives different outputs
    with_positions = layer(positions(x))[:, perm]
    permuted_first = layer(positions(x[:, perm]))
    assert (with_positions - permuted_first).abs().max() > 1e-2
