"""The decoder-only language model: one block equals PyTorch's pre-norm encoder layer with a causal mask,
the cache gives the same logits and the same samples, weight tying, the loss, the masks and the baselines."""

import math

import pytest
import torch
from torch import nn

import attention_course as ac
from attention_course.language_model import (
    bigram_cross_entropy,
    next_token_loss,
    prefix_causal_mask,
    train_language_model,
    unigram_cross_entropy,
    warmup_cosine_lr,
)


def _model(**kwargs):
    torch.manual_seed(0)
    return ac.DecoderOnlyLM(23, d_model=16, num_heads=2, num_layers=2, max_len=40, **kwargs).eval()


def test_block_equals_torch_encoder_layer_with_causal_mask():
    torch.manual_seed(0)
    reference = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=True).eval()
    block = ac.DecoderOnlyBlock.from_torch(reference)
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        expected = reference(x, src_mask=~ac.causal_mask(7))
        got = block(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="norm_first"):
        ac.DecoderOnlyBlock.from_torch(nn.TransformerEncoderLayer(16, 4, 32, batch_first=True))


def test_logits_are_causal():
    model = _model()
    tokens = torch.randint(0, 23, (1, 9))
    changed = tokens.clone()
    changed[0, 6:] = (changed[0, 6:] + 1) % 23
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, :6], after[:, :6])
    assert not torch.allclose(before[:, 6:], after[:, 6:])


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "none"])
def test_cached_step_equals_full_forward(positions):
    model = _model(positions=positions)
    tokens = torch.randint(0, 23, (3, 10))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        pieces = [model.step(tokens[:, :4], cache)] + [model.step(tokens[:, t:t + 1], cache) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-5, atol=1e-5)
    assert cache.num_bytes() == model.kv_cache_bytes(3, 10)


def test_cached_and_uncached_generation_agree():
    model = _model()
    prompt = torch.randint(0, 23, (2, 3))
    for settings in [dict(temperature=0), dict(temperature=1.0), dict(temperature=0.8, top_k=5, top_p=0.9)]:
        cached = model.generate(prompt, 15, use_cache=True, generator=torch.Generator().manual_seed(1), **settings)
        plain = model.generate(prompt, 15, use_cache=False, generator=torch.Generator().manual_seed(1), **settings)
        assert cached.shape == (2, 18) and torch.equal(cached[:, :3], prompt)
        assert torch.equal(cached, plain), settings
    assert model.generate(prompt[0], 4, temperature=0).shape == (7,)
    with pytest.raises(ValueError, match="max_len"):
        model.generate(prompt, 38)


def test_weight_tying_saves_vocab_times_d_model():
    tied, untied = _model(), _model(tie_weights=False)
    assert tied.tied and not untied.tied
    assert ac.count_parameters(untied) - ac.count_parameters(tied) == 23 * 16


def test_next_token_loss_is_shifted_and_ignores_padding():
    logits = torch.randn(2, 5, 7)
    tokens = torch.tensor([[1, 2, 3, 4, 5], [3, 3, 6, 0, 0]])
    manual = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 7), tokens[:, 1:].reshape(-1), ignore_index=0)
    torch.testing.assert_close(next_token_loss(logits, tokens, ignore_index=0), manual)
    unshifted = nn.functional.cross_entropy(logits.reshape(-1, 7), tokens.reshape(-1), ignore_index=0)
    assert not torch.isclose(next_token_loss(logits, tokens, ignore_index=0), unshifted)


def test_prefix_mask():
    mask = prefix_causal_mask(torch.tensor([2, 0]), 4)
    assert mask.shape == (2, 1, 4, 4)
    assert torch.equal(mask[1, 0], ac.causal_mask(4))
    assert mask[0, 0, 0, 1] and not mask[0, 0, 0, 2] and mask[0, 0, 2, 2] and not mask[0, 0, 2, 3]


def test_baselines():
    train = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])
    assert math.isclose(unigram_cross_entropy(train, train, 2, alpha=0.0), math.log(2))
    assert bigram_cross_entropy(train, train, 2, alpha=1e-6) < 1e-4  # alternation is predictable from one token


def test_schedule():
    assert warmup_cosine_lr(5, 10, 100, 1.0) == 0.5
    assert warmup_cosine_lr(10, 10, 100, 1.0) == 1.0
    assert math.isclose(warmup_cosine_lr(100, 10, 100, 1.0), 0.1)
    assert warmup_cosine_lr(40, 10, 100, 1.0) > warmup_cosine_lr(60, 10, 100, 1.0)


def test_training_lowers_the_loss_on_a_repetitive_sequence():
    ids = torch.arange(6).repeat(50)
    model = _model()
    log = train_language_model(model, ids, 60, batch_size=8, length=12, lr=1e-2, warmup=5,
                               generator=torch.Generator().manual_seed(0))
    assert log.amp_dtype is None and sum(log.losses[-5:]) / 5 < 0.3 * log.losses[0]


def test_bad_inputs():
    with pytest.raises(ValueError, match="positions"):
        ac.DecoderOnlyLM(10, positions="rotary-ish")
    with pytest.raises(ValueError, match="int64"):
        _model()(torch.randn(2, 3))


def test_grouped_query_options_pass_through_to_attention():
    model = _model(config=ac.ModelConfig(num_kv_heads=1))
    assert model.blocks[0].self_attention.num_kv_heads == 1
    tokens = torch.randint(0, 23, (2, 8))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        pieces = [model.step(tokens[:, :3], cache)] + [model.step(tokens[:, t:t + 1], cache) for t in range(3, 8)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-5, atol=1e-5)
    assert cache.num_bytes() == model.kv_cache_bytes(2, 8) == _model().kv_cache_bytes(2, 8) // 2
