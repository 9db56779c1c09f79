"""Encoder and decoder layers equal PyTorch's (post-norm and pre-norm) and keep their attention maps."""

import pytest
import torch
from torch import nn

from attention_course import DecoderLayer, EncoderLayer, causal_mask, padding_mask

D_MODEL, HEADS, D_FF = 16, 4, 32


def _randomise_norms(module):
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, nn.LayerNorm):
                sub.weight.normal_()
                sub.bias.normal_()


def _inputs(dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randn(3, 7, D_MODEL, generator=g).to(dtype)
    tgt = torch.randn(3, 5, D_MODEL, generator=g).to(dtype)
    tokens = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4])
    return src, tgt, tokens


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize(("dtype", "atol"), [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_encoder_layer_matches_torch(norm_first, dtype, atol):
    torch.manual_seed(0)
    reference = nn.TransformerEncoderLayer(
        D_MODEL, HEADS, D_FF, dropout=0.1, batch_first=True, norm_first=norm_first, dtype=dtype
    ).eval()
    _randomise_norms(reference)
    layer = EncoderLayer.from_torch(reference)
    assert not layer.training and layer.norm_first == norm_first
    src, _, tokens = _inputs(dtype)
    expected = reference(src, src_key_padding_mask=tokens == 0)
    got = layer(src, mask=padding_mask(tokens, 0))
    torch.testing.assert_close(got, expected, rtol=0, atol=atol)
    assert layer.self_attention_weights.shape == (3, HEADS, 7, 7)
    assert (layer.self_attention_weights[2, :, :, 3:] == 0).all()


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize(("dtype", "atol"), [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_decoder_layer_matches_torch(norm_first, dtype, atol):
    torch.manual_seed(0)
    reference = nn.TransformerDecoderLayer(
        D_MODEL, HEADS, D_FF, dropout=0.1, batch_first=True, norm_first=norm_first, dtype=dtype
    ).eval()
    _randomise_norms(reference)
    layer = DecoderLayer.from_torch(reference)
    memory, tgt, tokens = _inputs(dtype)
    expected = reference(
        tgt, memory, tgt_mask=~causal_mask(5), memory_key_padding_mask=tokens == 0, tgt_is_causal=False
    )
    got = layer(tgt, memory, self_mask=causal_mask(5), memory_mask=padding_mask(tokens, 0))
    torch.testing.assert_close(got, expected, rtol=0, atol=atol)
    assert layer.self_attention_weights.shape == (3, HEADS, 5, 5)
    assert layer.cross_attention_weights.shape == (3, HEADS, 5, 7)
    assert (layer.self_attention_weights.triu(diagonal=1) == 0).all()
    assert not layer.cross_attention_weights.requires_grad


def test_sequence_first_torch_layers_and_custom_eps_are_copied():
    torch.manual_seed(0)
    reference = nn.TransformerDecoderLayer(D_MODEL, HEADS, D_FF, layer_norm_eps=0.5, dtype=torch.float64).eval()
    layer = DecoderLayer.from_torch(reference)
    assert layer.norm1.eps == layer.norm2.eps == layer.norm3.eps == 0.5
    memory, tgt, _ = _inputs(torch.float64)
    expected = reference(tgt.transpose(0, 1), memory.transpose(0, 1)).transpose(0, 1)
    torch.testing.assert_close(layer(tgt, memory), expected, rtol=0, atol=1e-10)


def test_decoder_layer_has_no_causal_leakage():
    torch.manual_seed(0)
    layer = DecoderLayer(D_MODEL, HEADS, D_FF, dropout=0.0).double().eval()
    memory, tgt, _ = _inputs(torch.float64)
    out = layer(tgt, memory, self_mask=causal_mask(5))
    changed = tgt.clone()
    changed[:, 3:] = torch.randn(3, 2, D_MODEL, dtype=torch.float64)
    out_changed = layer(changed, memory, self_mask=causal_mask(5))
    torch.testing.assert_close(out_changed[:, :3], out[:, :3], rtol=0, atol=1e-12)
    assert (out_changed[:, 3:] - out[:, 3:]).abs().max() > 1e-3
    # without the mask, the future does leak: the test above can fail
    leaky = layer(changed, memory)
    assert (leaky[:, :3] - layer(tgt, memory)[:, :3]).abs().max() > 1e-3


def test_dropout_is_active_in_training_only():
    torch.manual_seed(0)
    layer = EncoderLayer(D_MODEL, HEADS, D_FF, dropout=0.3)
    src, _, _ = _inputs(torch.float32)
    assert not torch.allclose(layer(src), layer(src))
    layer.eval()
    torch.testing.assert_close(layer(src), layer(src), rtol=0, atol=0)


def test_post_norm_output_is_normalised_and_pre_norm_is_not():
    torch.manual_seed(0)
    src, _, _ = _inputs(torch.float64)
    post = EncoderLayer(D_MODEL, HEADS, D_FF, dropout=0.0).double().eval()
    pre = EncoderLayer(D_MODEL, HEADS, D_FF, dropout=0.0, norm_first=True).double().eval()
    out_post, out_pre = post(src * 10), pre(src * 10)
    torch.testing.assert_close(out_post.mean(-1), torch.zeros(3, 7, dtype=torch.float64), rtol=0, atol=1e-10)
    assert out_pre.mean(-1).abs().max() > 1e-3  # the residual stream is left as it is
