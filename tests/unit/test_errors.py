"""Every bad input raises ValueError or TypeError with a message naming the offending shapes or values."""

import pytest
import torch
from torch import nn

from attention_course import (
    AdditiveAttention,
    DecoderLayer,
    Dropout,
    EncoderLayer,
    LayerNorm,
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    PositionalEncoding,
    PositionwiseFeedForward,
    Transformer,
    causal_mask,
    combine_masks,
    padding_mask,
    scaled_dot_product_attention,
    sinusoidal_positional_encoding,
    transformer_parameter_count,
)


def test_attention_rejects_mismatched_feature_sizes():
    q, k, v = torch.randn(2, 5, 8), torch.randn(2, 7, 6), torch.randn(2, 7, 4)
    with pytest.raises(ValueError, match=r"query \(2, 5, 8\) \(d_k=8\) and key \(2, 7, 6\) \(d_k=6\)"):
        scaled_dot_product_attention(q, k, v)


def test_attention_rejects_mismatched_key_value_lengths():
    q, k, v = torch.randn(5, 8), torch.randn(7, 8), torch.randn(6, 4)
    with pytest.raises(ValueError, match=r"key \(7, 8\) \(Lk=7\) and value \(6, 4\) \(Lk=6\)"):
        scaled_dot_product_attention(q, k, v)


def test_attention_rejects_batch_dimensions_that_do_not_broadcast():
    q, k, v = torch.randn(2, 5, 8), torch.randn(3, 7, 8), torch.randn(3, 7, 4)
    with pytest.raises(ValueError, match=r"\(2, 5, 8\).*\(3, 7, 8\).*do not broadcast"):
        scaled_dot_product_attention(q, k, v)


def test_attention_rejects_vectors():
    with pytest.raises(ValueError, match=r"query must have at least 2 dimensions.*\(8,\)"):
        scaled_dot_product_attention(torch.randn(8), torch.randn(3, 8), torch.randn(3, 8))


@pytest.mark.parametrize("mask_shape", [(5, 6), (3, 5, 7), (2, 2, 5, 7), (1, 2, 5, 7)])
def test_attention_rejects_masks_that_do_not_broadcast_or_would_enlarge_the_scores(mask_shape):
    q, k, v = torch.randn(2, 5, 8), torch.randn(2, 7, 8), torch.randn(2, 7, 4)
    mask = torch.ones(mask_shape, dtype=torch.bool)
    shape = ", ".join(map(str, mask_shape))
    with pytest.raises(ValueError, match=rf"mask of shape \({shape}\) .* scores of shape \(2, 5, 7\)"):
        scaled_dot_product_attention(q, k, v, mask=mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.uint8])
def test_attention_rejects_non_boolean_masks(dtype):
    q = torch.randn(2, 5, 8)
    with pytest.raises(TypeError, match=rf"torch.bool.*got {dtype}"):
        scaled_dot_product_attention(q, q, q, mask=torch.ones(5, 5, dtype=dtype))


def test_attention_rejects_bad_dropout():
    q = torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\), got 1.5"):
        scaled_dot_product_attention(q, q, q, dropout_p=1.5)


def test_multihead_rejects_indivisible_heads_and_bad_sizes():
    with pytest.raises(ValueError, match="d_model=10 is not divisible by num_heads=4"):
        MultiHeadAttention(10, 4)
    with pytest.raises(ValueError, match="num_heads must be at least 1, got 0"):
        MultiHeadAttention(8, 0)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got -0.1"):
        MultiHeadAttention(8, 2, dropout=-0.1)


def test_multihead_rejects_bad_inputs():
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"key must have shape \(batch, length, d_model=8\), got \(2, 5, 6\)"):
        mha(x, torch.randn(2, 5, 6), x)
    with pytest.raises(ValueError, match=r"same batch size.*\(2, 5, 8\), \(3, 5, 8\)"):
        mha(x, torch.randn(3, 5, 8), torch.randn(3, 5, 8))
    with pytest.raises(ValueError, match=r"key and value must have the same length.*\(2, 5, 8\) and \(2, 4, 8\)"):
        mha(x, x, torch.randn(2, 4, 8))
    with pytest.raises(ValueError, match=r"mask of shape \(5, 4\).*\(2, 2, 5, 5\)"):
        mha(x, x, x, mask=torch.ones(5, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="torch.bool"):
        mha(x, x, x, mask=causal_mask(5).float())


def test_multihead_from_torch_rejects_unsupported_modules():
    with pytest.raises(ValueError, match="embed_dim=8, kdim=4, vdim=8"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, kdim=4))
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(TypeError, match="got Linear"):
        MultiHeadAttention.from_torch(nn.Linear(8, 8))


def test_mask_builders_reject_bad_arguments():
    with pytest.raises(ValueError, match="size must be at least 1, got 0"):
        causal_mask(0)
    with pytest.raises(TypeError, match="size must be an int, got float 2.0"):
        causal_mask(2.0)
    with pytest.raises(ValueError, match=r"shape \(batch, length\), got shape \(4,\)"):
        padding_mask(torch.tensor([1, 2, 0, 0]), 0)
    with pytest.raises(TypeError, match="integer token ids, got dtype torch.float32"):
        padding_mask(torch.zeros(2, 3), 0)
    with pytest.raises(TypeError, match="mask 1 must be a bool tensor.*torch.int64"):
        combine_masks(causal_mask(3), torch.ones(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"mask 1 of shape \(4, 4\).*combined shape \(3, 3\)"):
        combine_masks(causal_mask(3), causal_mask(4))


def test_positional_encodings_reject_bad_arguments():
    with pytest.raises(ValueError, match="d_model must be even.*d_model=7"):
        sinusoidal_positional_encoding(10, 7)
    with pytest.raises(ValueError, match="num_positions must be at least 1, got -1"):
        sinusoidal_positional_encoding(-1, 8)
    with pytest.raises(ValueError, match="d_model must be even.*d_model=5"):
        PositionalEncoding(5)
    module = PositionalEncoding(8, max_len=10)
    with pytest.raises(ValueError, match=r"positions 0..11 exceed max_len=10"):
        module(torch.randn(1, 12, 8))
    with pytest.raises(ValueError, match=r"positions 8..10 exceed max_len=10"):
        module(torch.randn(1, 3, 8), offset=8)
    with pytest.raises(ValueError, match=r"d_model=8\), got \(1, 3, 6\)"):
        module(torch.randn(1, 3, 6))
    with pytest.raises(ValueError, match=r"positions 0..5 exceed max_len=4"):
        LearnedPositionalEmbedding(4, 8)(torch.randn(2, 6, 8))


def test_normalization_rejects_bad_arguments():
    for p in (-0.1, 1.5):
        with pytest.raises(ValueError, match=rf"p must be a number in \[0, 1\], got {p}"):
            Dropout(p)
    with pytest.raises(ValueError, match="got '0.5'"):
        Dropout("0.5")
    with pytest.raises(ValueError, match="eps must be positive, got 0"):
        LayerNorm(8, eps=0)
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 8\), got \(2, 6\)"):
        LayerNorm(8)(torch.randn(2, 6))
    with pytest.raises(ValueError, match="d_ff must be at least 1, got 0"):
        PositionwiseFeedForward(8, 0)


def test_layers_from_torch_reject_unsupported_layers():
    with pytest.raises(ValueError, match="only the ReLU activation is supported, got <built-in function gelu>"):
        EncoderLayer.from_torch(nn.TransformerEncoderLayer(8, 2, 16, activation="gelu"))
    with pytest.raises(TypeError, match="expected an nn.TransformerDecoderLayer, got TransformerEncoderLayer"):
        DecoderLayer.from_torch(nn.TransformerEncoderLayer(8, 2, 16))


def test_transformer_rejects_tying_different_vocabularies():
    with pytest.raises(ValueError, match="src_vocab_size=100 and tgt_vocab_size=120"):
        Transformer(100, 120, d_model=8, num_heads=2, d_ff=16, tie_embeddings=True)
    with pytest.raises(ValueError, match="vocab_size=100 and tgt_vocab_size=120"):
        transformer_parameter_count(100, 8, 16, 2, tgt_vocab_size=120)
    with pytest.raises(ValueError, match="num_encoder_layers must be at least 1, got 0"):
        Transformer(10, 10, d_model=8, num_heads=2, d_ff=16, num_encoder_layers=0)


def test_transformer_rejects_bad_token_shapes_and_lengths():
    model = Transformer(10, 10, d_model=8, num_heads=2, d_ff=16, num_encoder_layers=1, num_decoder_layers=1,
                        max_len=6)
    with pytest.raises(ValueError, match=r"shape \(batch, length\), got \(5,\)"):
        model.encode(torch.arange(5))
    with pytest.raises(ValueError, match="exceed max_len=6"):
        model.encode(torch.zeros(1, 7, dtype=torch.long))


def test_additive_attention_rejects_bad_shapes():
    attention = AdditiveAttention(4, 3, 5)
    with pytest.raises(ValueError, match=r"query_dim=4\), got \(2, 1, 3\)"):
        attention(torch.randn(2, 1, 3), torch.randn(2, 6, 3), torch.randn(2, 6, 2))
    with pytest.raises(ValueError, match=r"key \(2, 6, 3\) and value \(2, 5, 2\)"):
        attention(torch.randn(2, 1, 4), torch.randn(2, 6, 3), torch.randn(2, 5, 2))
