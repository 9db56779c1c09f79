"""Encoder/decoder stacks equal nn.Transformer's; the full model embeds, ties, masks and decodes correctly."""

import math

import pytest
import torch
from torch import nn

from attention_course import (
    Decoder,
    Encoder,
    Transformer,
    causal_mask,
    combine_masks,
    padding_mask,
    sinusoidal_positional_encoding,
)


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")  # torch's note about its own fast path
@pytest.mark.parametrize("norm_first", [False, True])
def test_stacks_match_nn_transformer(norm_first):
    torch.manual_seed(0)
    reference = nn.Transformer(
        16, 4, num_encoder_layers=2, num_decoder_layers=3, dim_feedforward=32, dropout=0.1, batch_first=True,
        norm_first=norm_first, dtype=torch.float64,
    ).eval()
    encoder, decoder = Encoder.from_torch(reference.encoder), Decoder.from_torch(reference.decoder)
    assert len(encoder.layers) == 2 and len(decoder.layers) == 3 and encoder.norm is not None
    g = torch.Generator().manual_seed(1)
    src = torch.randn(2, 6, 16, generator=g, dtype=torch.float64)
    tgt = torch.randn(2, 4, 16, generator=g, dtype=torch.float64)
    src_tokens = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    expected = reference(
        src, tgt, tgt_mask=~causal_mask(4), src_key_padding_mask=src_tokens == 0,
        memory_key_padding_mask=src_tokens == 0,
    )
    src_mask = padding_mask(src_tokens, 0)
    got = decoder(tgt, encoder(src, src_mask), self_mask=causal_mask(4), memory_mask=src_mask)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


def test_final_norm_defaults_to_pre_norm_only():
    assert Encoder(2, 8, 2, 16, norm_first=False).norm is None
    assert Decoder(2, 8, 2, 16, norm_first=True).norm is not None
    assert Encoder(2, 8, 2, 16, final_norm=True).norm is not None


def _small_model(**kwargs):
    torch.manual_seed(0)
    options = dict(d_model=16, num_heads=2, num_encoder_layers=2, num_decoder_layers=2, d_ff=32, dropout=0.1,
                   max_len=20)
    options.update(kwargs)
    return Transformer(11, 13, **options)


def test_forward_shape_and_encode_decode_split():
    model = _small_model().eval()
    src = torch.randint(1, 11, (3, 7))
    tgt = torch.randint(1, 13, (3, 5))
    src[2, 5:] = 0
    src_mask = padding_mask(src, 0)
    tgt_mask = combine_masks(padding_mask(tgt, 0), causal_mask(5))
    logits = model(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask, memory_mask=src_mask)
    assert logits.shape == (3, 5, 13)
    memory = model.encode(src, src_mask)
    assert memory.shape == (3, 7, 16)
    torch.testing.assert_close(model.decode(tgt, memory, tgt_mask, src_mask), logits, rtol=0, atol=0)
    # the source padding really is hidden from the decoder
    assert (model.decoder.layers[0].cross_attention_weights[2, :, :, 5:] == 0).all()


def test_embeddings_are_scaled_and_positions_added():
    model = _small_model().eval()
    src = torch.randint(0, 11, (2, 6))
    expected = model.src_embedding(src) * math.sqrt(16) + sinusoidal_positional_encoding(6, 16)
    torch.testing.assert_close(model.embed_source(src), expected, rtol=0, atol=1e-6)
    tgt = torch.randint(0, 13, (2, 3))
    expected = model.tgt_embedding(tgt) * 4 + sinusoidal_positional_encoding(10, 16)[4:7]
    torch.testing.assert_close(model.embed_target(tgt, offset=4), expected, rtol=0, atol=1e-6)


def test_tied_embeddings_share_one_matrix_three_ways():
    torch.manual_seed(0)
    model = Transformer(17, 17, d_model=8, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=16,
                        tie_embeddings=True)
    weight = model.src_embedding.weight
    assert model.tgt_embedding.weight is weight and model.generator.weight is weight
    assert model.generator.bias is None
    untied = Transformer(17, 17, d_model=8, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=16)
    assert untied.tgt_embedding.weight is not untied.src_embedding.weight
    assert untied.generator.bias is not None
    # every use contributes to the one gradient: source embedding, target embedding, output projection
    src, tgt = torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5]])
    model(src, tgt).logsumexp(-1).sum().backward()
    grad = weight.grad
    assert (grad[[1, 2, 3]] != 0).any(dim=1).all() and (grad[[4, 5]] != 0).any(dim=1).all()
    assert (grad[10] != 0).any()  # a token used nowhere still gets a gradient through the output projection


def test_no_causal_leakage_in_the_full_model():
    model = _small_model().eval()
    src = torch.randint(1, 11, (2, 6))
    tgt = torch.randint(1, 13, (2, 7))
    logits = model(src, tgt, tgt_mask=causal_mask(7))
    changed = tgt.clone()
    changed[:, 4:] = (tgt[:, 4:] % 12) + 1  # different future tokens
    logits_changed = model(src, changed, tgt_mask=causal_mask(7))
    torch.testing.assert_close(logits_changed[:, :4], logits[:, :4], rtol=0, atol=1e-6)
    assert (logits_changed[:, 4:] - logits[:, 4:]).abs().max() > 1e-3


def test_source_order_matters_only_through_positions():
    model = _small_model().eval()
    src = torch.tensor([[1, 2, 3, 4, 5, 6]])
    perm = torch.tensor([5, 3, 1, 0, 2, 4])
    memory = model.encode(src)
    assert (model.encode(src[:, perm]) - memory[:, perm]).abs().max() > 1e-2
    embedded = model.src_embedding(src)  # the same stack without positions is permutation-equivariant
    torch.testing.assert_close(model.encoder(embedded[:, perm]), model.encoder(embedded)[:, perm],
                               rtol=0, atol=1e-5)


def test_pre_norm_model_has_final_norms_and_trains_a_step():
    model = _small_model(norm_first=True, dropout=0.0)
    assert model.encoder.norm is not None and model.decoder.norm is not None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    src, tgt = torch.randint(1, 11, (4, 6)), torch.randint(1, 13, (4, 5))
    losses = []
    for _ in range(2):
        logits = model(src, tgt[:, :-1], tgt_mask=causal_mask(4))
        loss = nn.functional.cross_entropy(logits.reshape(-1, 13), tgt[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses) and losses[1] < losses[0]


def test_scaled_embeddings_have_unit_variance_and_positions_mean_square_one_half():
    """The docstring's claim: embeddings times √d_model have variance 1; sinusoids have mean square 1/2."""
    torch.manual_seed(0)
    d_model = 256
    model = Transformer(2000, 2000, d_model=d_model, num_encoder_layers=1, num_decoder_layers=1)
    scaled = model.src_embedding.weight * d_model**0.5
    assert abs(scaled.var().item() - 1.0) < 0.02
    table = sinusoidal_positional_encoding(512, d_model)
    assert abs(table.pow(2).mean().item() - 0.5) < 0.01
