"""The modern block and the configuration object: RMSNorm equals PyTorch's, SwiGLU and GELU compute their
formulas, bias-free projections have no biases, GPT-2's scaled initialisation has the stated spread, the
rotate-half rotary pairing is the interleaved one on permuted features, one kernel serves grouped heads, bias
and half precision, the sliding-window rule is shared, and a rank-3 mask is refused."""

import math

import pytest
import torch
from torch import nn

import attention_course as ac
from attention_course.config import resolve_config


# --- a rank-3 mask is refused ---------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [2, 4])  # 4 = the number of heads, where broadcasting would read it per head
def test_rank3_mask_is_refused_for_every_batch_size(batch):
    attention = ac.MultiHeadAttention(16, 4).eval()
    x = torch.randn(batch, 5, 16)
    mask = torch.ones(batch, 5, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"rank 3.*\(B, 1, Lq, Lk\).*\(1, H, Lq, Lk\)"):
        attention(x, x, x, mask=mask)


def test_rank4_per_item_mask_is_read_per_batch_item():
    torch.manual_seed(0)
    attention = ac.MultiHeadAttention(16, 4).eval()
    x = torch.randn(4, 5, 16)
    per_item = torch.rand(4, 5, 5) > 0.3
    per_item[..., 0] = True
    output, _ = attention(x, x, x, mask=per_item[:, None])
    for b in range(4):
        alone, _ = attention(x[b : b + 1], x[b : b + 1], x[b : b + 1], mask=per_item[b])
        torch.testing.assert_close(output[b : b + 1], alone)


# --- the configuration object ----------------------------------------------------------------------------------
def test_config_defaults_build_todays_modules():
    torch.manual_seed(0)
    old = ac.DecoderOnlyLM(11, d_model=16, num_heads=2, num_layers=2, max_len=12)
    torch.manual_seed(0)
    new = ac.DecoderOnlyLM(11, d_model=16, num_heads=2, num_layers=2, max_len=12, config=ac.ModelConfig())
    assert [n for n, _ in old.named_parameters()] == [n for n, _ in new.named_parameters()]
    tokens = torch.randint(0, 11, (2, 9))
    torch.testing.assert_close(old.eval()(tokens), new.eval()(tokens), rtol=0, atol=0)
    assert isinstance(new.blocks[0].norm1, ac.LayerNorm)
    assert isinstance(new.blocks[0].feed_forward, ac.PositionwiseFeedForward)


def test_attention_options_reach_the_attention_through_the_config():
    block = ac.DecoderOnlyBlock(16, 4, 32, config=ac.ModelConfig(num_kv_heads=2, positions="rotary"))
    assert block.self_attention.num_kv_heads == 2 and block.self_attention.positions == "rotary"
    model = ac.DecoderOnlyLM(11, d_model=16, num_heads=4, num_layers=1, config=ac.ModelConfig(num_kv_heads=1))
    assert model.config.num_kv_heads == 1 and model.blocks[0].self_attention.w_k.out_features == 4


@pytest.mark.parametrize(("module", "keyword"), [
    (lambda **kw: ac.MultiHeadAttention(16, 4, **kw), "positions"),
    (lambda **kw: ac.MultiHeadAttention(16, 4, **kw), "rotary_base"),
    (lambda **kw: ac.EncoderLayer(16, 4, 32, **kw), "num_kv_heads"),
    (lambda **kw: ac.DecoderLayer(16, 4, 32, **kw), "positions"),
    (lambda **kw: ac.DecoderOnlyBlock(16, 4, 32, **kw), "attention_kwargs"),
    (lambda **kw: ac.DecoderOnlyLM(11, d_model=16, num_heads=4, **kw), "num_kv_heads"),
])
def test_options_of_the_config_have_no_second_keyword(module, keyword):
    # One way to say it: ModelConfig. The keywords it replaced are gone, not kept side by side.
    with pytest.raises(TypeError, match=keyword):
        module(**{keyword: 2})


def test_the_contract_keywords_of_multi_head_attention_fold_into_its_config():
    # COURSE.md's public signature names bias= and num_kv_heads= on MultiHeadAttention; they are shorthands
    # for the config, and one given both ways, differently, is refused rather than silently chosen.
    layer = ac.MultiHeadAttention(16, 4, bias=False, num_kv_heads=2)
    assert layer.config == ac.ModelConfig(bias=False, num_kv_heads=2)
    assert layer.w_q.bias is None and layer.w_k.out_features == 8
    same = ac.MultiHeadAttention(16, 4, num_kv_heads=2, config=ac.ModelConfig(num_kv_heads=2))
    assert same.num_kv_heads == 2
    with pytest.raises(ValueError, match="num_kv_heads=1 was given both"):
        ac.MultiHeadAttention(16, 4, num_kv_heads=1, config=ac.ModelConfig(num_kv_heads=2))


def test_config_must_be_a_model_config():
    with pytest.raises(TypeError, match="config must be an attention_course.ModelConfig, got dict"):
        ac.MultiHeadAttention(16, 4, config={"num_kv_heads": 2})


@pytest.mark.parametrize("bad, error", [
    (dict(norm="batchnorm"), ValueError), (dict(feed_forward="tanh"), ValueError),
    (dict(rotary_pairing="odd"), ValueError), (dict(window=0), ValueError), (dict(num_kv_heads=1.5), TypeError),
    (dict(bias=1), TypeError), (dict(norm_eps=0.0), ValueError), (dict(init="xavier"), ValueError),
])
def test_config_refuses_bad_values(bad, error):
    with pytest.raises(error):
        ac.ModelConfig(**bad)
    with pytest.raises(TypeError, match="ModelConfig"):
        resolve_config({"norm": "rmsnorm"})


def test_config_reaches_the_stacks_and_the_transformer():
    config = ac.ModelConfig(norm="rmsnorm", feed_forward="swiglu", bias=False, num_kv_heads=2)
    model = ac.Transformer(13, 13, d_model=16, num_heads=4, num_encoder_layers=1, num_decoder_layers=1, d_ff=24,
                           norm_first=True, config=config)
    for layer in (model.encoder.layers[0], model.decoder.layers[0]):
        assert isinstance(layer.norm1, ac.RMSNorm) and isinstance(layer.feed_forward, ac.SwiGLU)
        assert layer.self_attention.num_kv_heads == 2 and layer.self_attention.w_q.bias is None
    assert isinstance(model.encoder.norm, ac.RMSNorm)
    src, tgt = torch.randint(0, 13, (2, 6)), torch.randint(0, 13, (2, 5))
    assert model.eval()(src, tgt, tgt_mask=ac.causal_mask(5)).shape == (2, 5, 13)


# --- the modern block's pieces ---------------------------------------------------------------------------------
@pytest.mark.parametrize("eps", [1e-5, 1e-6])
def test_rmsnorm_equals_torch(eps):
    torch.manual_seed(0)
    ours, theirs = ac.RMSNorm(24, eps=eps), nn.RMSNorm(24, eps=eps)
    with torch.no_grad():
        weight = torch.randn(24)
        ours.weight.copy_(weight)
        theirs.weight.copy_(weight)
    x = torch.randn(3, 7, 24) * 5 + 2
    torch.testing.assert_close(ours(x), theirs(x))
    half = x.to(torch.bfloat16)
    torch.testing.assert_close(ours(half).float(), theirs.float()(half.float()).to(torch.bfloat16).float(),
                               rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError, match=r"\(\.\.\., 24\)"):
        ours(torch.randn(2, 23))


def test_rmsnorm_does_not_centre_and_layernorm_does():
    x = torch.randn(4, 16) + 3.0
    assert ac.LayerNorm(16)(x).mean(-1).abs().max() < 1e-5
    assert ac.RMSNorm(16)(x).mean(-1).min() > 0.5  # the mean of 3 survives RMS normalisation
    torch.testing.assert_close(ac.RMSNorm(16)(x).pow(2).mean(-1), torch.ones(4), rtol=1e-4, atol=1e-4)


def test_swiglu_computes_its_formula():
    torch.manual_seed(0)
    swiglu = ac.SwiGLU(8, 12)
    x = torch.randn(2, 3, 8)
    gate, up = x @ swiglu.gate.weight.T, x @ swiglu.up.weight.T
    expected = (gate * torch.sigmoid(gate) * up) @ swiglu.down.weight.T
    torch.testing.assert_close(swiglu(x), expected)
    assert swiglu.gate.bias is None and swiglu.output_projection is swiglu.down


def test_gelu_tanh_is_gpt2s_approximation():
    torch.manual_seed(0)
    ff = ac.PositionwiseFeedForward(8, 16, activation="gelu_tanh")
    x = torch.randn(5, 8)
    hidden = ff.linear1(x)
    gpt2_gelu = 0.5 * hidden * (1 + torch.tanh(math.sqrt(2 / math.pi) * (hidden + 0.044715 * hidden**3)))
    torch.testing.assert_close(ff(x), ff.linear2(gpt2_gelu))
    exact = ac.PositionwiseFeedForward(8, 16, activation="gelu")
    with torch.no_grad():
        exact.load_state_dict(ff.state_dict())
    assert not torch.equal(exact(x), ff(x))  # the exact GELU differs from the approximation...
    torch.testing.assert_close(exact(x), ff(x), rtol=0, atol=1e-3)  # ...by less than 1e-3 here
    with pytest.raises(ValueError, match="activation"):
        ac.PositionwiseFeedForward(8, 16, activation="swish")


def test_bias_free_model_has_no_bias_parameters():
    config = ac.ModelConfig(bias=False)
    model = ac.DecoderOnlyLM(11, d_model=16, num_heads=2, num_layers=2, config=config)
    names = [name for name, _ in model.named_parameters()]
    assert not [name for name in names if name.endswith("bias")], names
    with_bias = ac.DecoderOnlyLM(11, d_model=16, num_heads=2, num_layers=2)
    assert sum(p.numel() for p in with_bias.parameters()) > sum(p.numel() for p in model.parameters())


def test_gpt2_init_scales_residual_projections():
    torch.manual_seed(0)
    layers = 8
    model = ac.DecoderOnlyLM(50, d_model=256, num_heads=4, num_layers=layers, config=ac.ModelConfig(init="gpt2"))
    residual_std = 0.02 / math.sqrt(2 * layers)
    for block in model.blocks:
        for weight in (block.self_attention.w_o.weight, block.feed_forward.linear2.weight):
            assert abs(weight.std().item() / residual_std - 1) < 0.05
        assert abs(block.self_attention.w_q.weight.std().item() / 0.02 - 1) < 0.05
        assert torch.count_nonzero(block.feed_forward.linear1.bias) == 0
    default = ac.DecoderOnlyLM(50, d_model=256, num_heads=4, num_layers=layers)
    assert default.blocks[0].self_attention.w_o.weight.std() > 5 * residual_std  # Xavier is much wider


# --- rotary pairings ------------------------------------------------------------------------------------------
def test_rotate_half_is_the_interleaved_rotation_of_permuted_features():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 8, dtype=torch.float64)
    perm = torch.tensor([0, 2, 4, 6, 1, 3, 5, 7])  # half layout position k holds interleaved feature perm[k]
    half = ac.apply_rotary(x[..., perm], pairing="half")
    torch.testing.assert_close(half, ac.apply_rotary(x)[..., perm])
    assert not torch.allclose(ac.apply_rotary(x, pairing="half"), ac.apply_rotary(x))


def test_rotate_half_matches_llamas_formula():
    torch.manual_seed(0)
    x, positions, base = torch.randn(1, 2, 5, 6), torch.arange(3, 8), 500.0
    inv_freq = 1.0 / base ** (torch.arange(0, 6, 2).float() / 6)
    angles = torch.cat([positions[:, None] * inv_freq] * 2, dim=-1)  # (L, d)
    rotate_half = torch.cat([-x[..., 3:], x[..., :3]], dim=-1)
    expected = x * angles.cos() + rotate_half * angles.sin()
    torch.testing.assert_close(ac.apply_rotary(x, positions, base, pairing="half"), expected)
    with pytest.raises(ValueError, match="pairing"):
        ac.apply_rotary(x, pairing="neox")


# --- one kernel ---------------------------------------------------------------------------------------------------
def _repeat_kv(x, group):
    return x.repeat_interleave(group, dim=1)


def test_grouped_query_with_bias_equals_repeated_heads_through_the_kernel():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    bias = ac.alibi_bias(4, 5)  # (4, 5, 5)
    mask = ac.causal_mask(5)
    out, weights = ac.grouped_query_attention(q, k, v, mask=mask, bias=bias)
    ref_out, ref_weights = ac.scaled_dot_product_attention(q, _repeat_kv(k, 2), _repeat_kv(v, 2), mask=mask,
                                                           bias=bias)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(weights, ref_weights)
    with pytest.raises(ValueError, match=r"bias of shape \(3, 5, 5\)"):
        ac.grouped_query_attention(q, k, v, bias=torch.zeros(3, 5, 5))
    with pytest.raises(TypeError, match="bias"):
        ac.scaled_dot_product_attention(q, q, q, bias=torch.zeros(5, 5, dtype=torch.long))


def test_alibi_grouped_attention_in_half_precision_computes_in_float32():
    """The ALiBi branch once skipped the kernel's float32 computation: large scores overflowed float16."""
    torch.manual_seed(0)
    q = torch.randn(1, 4, 6, 8, dtype=torch.float16) * 200  # scores beyond float16's 65504
    k, v = torch.randn(1, 2, 6, 8, dtype=torch.float16) * 200, torch.randn(1, 2, 6, 8, dtype=torch.float16)
    bias = ac.alibi_bias(4, 6).half()
    out, weights = ac.grouped_query_attention(q, k, v, mask=ac.causal_mask(6), bias=bias)
    ref_out, _ = ac.grouped_query_attention(q.double(), k.double(), v.double(), mask=ac.causal_mask(6),
                                            bias=bias.double())
    assert out.dtype == torch.float16 and torch.isfinite(out).all() and torch.isfinite(weights).all()
    torch.testing.assert_close(out.double(), ref_out, rtol=2e-2, atol=2e-2)


# --- the sliding-window rule, once ----------------------------------------------------------------------------
def test_window_config_masks_and_caches_agree():
    torch.manual_seed(0)
    config = ac.ModelConfig(positions="rotary", window=3)
    model = ac.DecoderOnlyLM(17, d_model=16, num_heads=2, num_layers=2, max_len=20, positions="none",
                             config=config).eval()
    tokens = torch.randint(0, 17, (2, 10))
    windowed = model(tokens)
    torch.testing.assert_close(windowed, model(tokens, mask=ac.sliding_window_mask(10, 3)))
    assert not torch.allclose(windowed, model(tokens, mask=ac.causal_mask(10)))
    cache = model.new_cache()
    assert all(c.window == 3 for c in cache.layers)
    stepped = torch.cat([model.step(tokens[:, :4], cache)] + [model.step(tokens[:, i : i + 1], cache)
                                                               for i in range(4, 10)], dim=1)
    torch.testing.assert_close(stepped, windowed, rtol=1e-5, atol=1e-5)
    positions = torch.arange(6)
    assert torch.equal(ac.window_mask(positions, positions, 2), ac.sliding_window_mask(6, 2))
    assert torch.equal(ac.window_mask(positions, positions), ac.causal_mask(6))


def test_llama_like_model_generates_the_same_with_and_without_cache():
    torch.manual_seed(0)
    config = ac.ModelConfig(positions="rotary", rotary_pairing="half", num_kv_heads=1, norm="rmsnorm",
                            feed_forward="swiglu", bias=False, init="gpt2")
    model = ac.DecoderOnlyLM(29, d_model=32, num_heads=4, num_layers=2, d_ff=48, max_len=30, positions="none",
                             tie_weights=False, config=config).eval()
    prompt = torch.randint(0, 29, (2, 4))
    cached = model.generate(prompt, 8, temperature=0)
    assert torch.equal(cached, model.generate(prompt, 8, temperature=0, use_cache=False))
    assert model.kv_cache_bytes(1, 10) == 2 * 2 * 1 * 8 * 10 * 4
