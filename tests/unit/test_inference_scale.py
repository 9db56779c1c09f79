"""Tests of chapter 15's library: grouped-query attention, sliding windows and the rolling KV cache, cached
decoding through the layers' explicit cache argument, and tiled attention's memory-saving backward pass."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attention_course as ac
from attention_course.cost import measure_peak_memory


def _qkv(g, q_heads, kv_heads, q_len=6, k_len=9, d=8, d_v=5, batch=2):
    return (torch.randn(batch, q_heads, q_len, d, generator=g, dtype=torch.float64),
            torch.randn(batch, kv_heads, k_len, d, generator=g, dtype=torch.float64),
            torch.randn(batch, kv_heads, k_len, d_v, generator=g, dtype=torch.float64))


# --- grouped-query attention --------------------------------------------------------------------------------
@pytest.mark.parametrize(("q_heads", "kv_heads"), [(8, 8), (8, 2), (8, 1), (6, 3)])
@pytest.mark.parametrize("mask_shape", [None, (6, 9), (2, 1, 6, 9), (2, "H", 6, 9)])
def test_grouped_query_attention_equals_torch_enable_gqa(q_heads, kv_heads, mask_shape):
    g = torch.Generator().manual_seed(q_heads * 10 + kv_heads)
    query, key, value = _qkv(g, q_heads, kv_heads)
    mask = None
    if mask_shape is not None:
        shape = tuple(q_heads if s == "H" else s for s in mask_shape)
        mask = torch.rand(shape, generator=g) > 0.3
    output, weights = ac.grouped_query_attention(query, key, value, mask=mask)
    expected = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(output, expected)
    assert weights.shape == (2, q_heads, 6, 9)
    # Query head h reads key/value head h // group: the same as repeating each kv head `group` times in a row.
    group = q_heads // kv_heads
    repeated, _ = ac.scaled_dot_product_attention(query, key.repeat_interleave(group, 1),
                                                  value.repeat_interleave(group, 1), mask=mask)
    torch.testing.assert_close(output, repeated)


def test_grouped_query_attention_order_is_interleave_not_tile():
    g = torch.Generator().manual_seed(0)
    query, key, value = _qkv(g, 4, 2)
    output, _ = ac.grouped_query_attention(query, key, value)
    tiled, _ = ac.scaled_dot_product_attention(query, key.repeat(1, 2, 1, 1), value.repeat(1, 2, 1, 1))
    assert not torch.allclose(output, tiled)


def test_grouped_query_attention_bias_is_added_to_scores():
    g = torch.Generator().manual_seed(1)
    query, key, value = _qkv(g, 4, 2, q_len=5, k_len=5)
    bias = ac.alibi_bias(4, 5).double()
    output, _ = ac.grouped_query_attention(query, key, value, bias=bias, mask=ac.causal_mask(5))
    expected = F.scaled_dot_product_attention(query, key, value, enable_gqa=True,
                                              attn_mask=bias.masked_fill(~ac.causal_mask(5), float("-inf")))
    torch.testing.assert_close(output, expected)


def test_grouped_query_attention_rejects_bad_shapes():
    g = torch.Generator().manual_seed(2)
    query, key, value = _qkv(g, 6, 4)
    with pytest.raises(ValueError, match=r"query heads \(6\) must be divisible by the number of key/value heads \(4\)"):
        ac.grouped_query_attention(query, key, value)
    query, key, value = _qkv(g, 4, 2)
    with pytest.raises(ValueError, match="must have shape \\(batch, heads, length, d_head\\)"):
        ac.grouped_query_attention(query[0], key, value)
    with pytest.raises(ValueError, match="same d_head"):
        ac.grouped_query_attention(query, key[..., :4], value)
    with pytest.raises(ValueError, match="does not broadcast"):
        ac.grouped_query_attention(query, key, value, mask=torch.ones(3, 6, 9, dtype=torch.bool))


def test_multihead_with_kv_heads_has_smaller_projections_and_equals_torch():
    torch.manual_seed(0)
    attention = ac.MultiHeadAttention(32, 8, config=ac.ModelConfig(num_kv_heads=2)).double().eval()
    assert attention.w_k.weight.shape == (8, 32) and attention.w_v.weight.shape == (8, 32)
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    output, weights = attention(x, x, x, mask=ac.causal_mask(5))
    q, k, v = (attention.split_heads(w(x)) for w in (attention.w_q, attention.w_k, attention.w_v))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(output, attention.w_o(attention.merge_heads(expected)))
    assert weights.shape == (2, 8, 5, 5)
    with pytest.raises(ValueError, match="num_heads=8 is not divisible by num_kv_heads=3"):
        ac.MultiHeadAttention(32, 8, config=ac.ModelConfig(num_kv_heads=3))


# --- sliding window and rolling cache -----------------------------------------------------------------------
def test_sliding_window_mask_definition():
    mask = ac.sliding_window_mask(7, 3)
    for i in range(7):
        for j in range(7):
            assert bool(mask[i, j]) == (0 <= i - j < 3)
    assert torch.equal(ac.sliding_window_mask(5, 5), ac.causal_mask(5))
    assert torch.equal(ac.sliding_window_mask(5, 1), torch.eye(5, dtype=torch.bool))
    with pytest.raises(ValueError, match="window must be at least 1, got 0"):
        ac.sliding_window_mask(5, 0)


@pytest.mark.parametrize("positions", [None, "rotary", "alibi"])
@pytest.mark.parametrize(("window", "kv_heads"), [(None, 4), (3, 4), (4, 1)])
def test_cached_attention_in_pieces_equals_full_attention(positions, window, kv_heads):
    torch.manual_seed(0)
    attention = ac.MultiHeadAttention(
        16, 4, config=ac.ModelConfig(num_kv_heads=kv_heads, positions=positions)
    ).double().eval()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    mask = ac.causal_mask(11) if window is None else ac.sliding_window_mask(11, window)
    expected, _ = attention(x, x, x, mask=mask)
    cache = ac.KVCache(window=window)
    pieces = [attention(x[:, :4], x[:, :4], x[:, :4], cache=cache)[0]]
    pieces += [attention(x[:, t:t + 1], x[:, t:t + 1], x[:, t:t + 1], cache=cache)[0] for t in range(4, 9)]
    pieces.append(attention(x[:, 9:], x[:, 9:], x[:, 9:], cache=cache)[0])
    torch.testing.assert_close(torch.cat(pieces, dim=1), expected, rtol=0, atol=1e-12)
    assert cache.position == 11
    assert len(cache) == (11 if window is None else window)
    assert cache.keys.shape == (2, kv_heads, len(cache), 4)


def test_encoder_layer_cache_for_a_decoder_only_stack():
    torch.manual_seed(2)
    layer = ac.EncoderLayer(16, 4, 32, dropout=0.0, norm_first=True,
                             config=ac.ModelConfig(num_kv_heads=2, positions="rotary")).double()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    expected = layer(x, ac.causal_mask(6))
    cache = ac.KVCache()
    steps = [layer(x[:, t:t + 1], cache=cache) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, 1), expected, rtol=0, atol=1e-12)


def test_decoder_layer_cache_projects_memory_once():
    torch.manual_seed(3)
    layer = ac.DecoderLayer(16, 4, 32, dropout=0.0).double().eval()
    x, memory = torch.randn(2, 5, 16, dtype=torch.float64), torch.randn(2, 7, 16, dtype=torch.float64)
    expected = layer(x, memory, ac.causal_mask(5))
    cache = ac.DecoderLayerCache()
    first = layer(x[:, :2], memory, cache=cache)
    keys = cache.cross_keys
    rest = [layer(x[:, t:t + 1], None, cache=cache) for t in range(2, 5)]
    assert cache.cross_keys is keys
    torch.testing.assert_close(torch.cat([first, *rest], 1), expected, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="memory is needed at the first cached step"):
        layer(x, None, cache=ac.DecoderLayerCache())
    with pytest.raises(TypeError, match="cache must be an attention_course.DecoderLayerCache"):
        layer(x, memory, cache=ac.KVCache())


def test_multihead_cache_rejects_cross_attention():
    attention = ac.MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match="same new positions"):
        attention(torch.randn(1, 2, 16), torch.randn(1, 3, 16), torch.randn(1, 3, 16), cache=ac.KVCache())
    with pytest.raises(TypeError, match="cache must be an attention_course.KVCache"):
        attention(torch.randn(1, 2, 16), torch.randn(1, 2, 16), torch.randn(1, 2, 16), cache=[])


def test_kv_cache_bytes_of_gqa_attention_matches_its_cache():
    attention = ac.MultiHeadAttention(64, 8, config=ac.ModelConfig(num_kv_heads=2)).eval()
    cache = ac.KVCache()
    with torch.no_grad():
        attention(*(torch.randn(3, 10, 64),) * 3, cache=cache)
    assert cache.keys.nbytes + cache.values.nbytes == ac.kv_cache_bytes(1, 2, 8, 10, batch=3, bytes_per_value=4)


# --- tiled attention: forward with masks, backward ----------------------------------------------------------
@pytest.mark.parametrize("is_causal", [False, True])
def test_tiled_attention_gradcheck(is_causal):
    g = torch.Generator().manual_seed(4)
    tensors = [t.requires_grad_() for t in _qkv(g, 2, 2, q_len=9, k_len=9, d=4, d_v=3, batch=1)]
    mask = torch.rand(9, 9, generator=g) > 0.3
    mask[2] = False  # a fully masked row: zero output, zero gradient, no NaN
    assert torch.autograd.gradcheck(
        lambda q, k, v: ac.tiled_attention(q, k, v, block_size=4, is_causal=is_causal, mask=mask), tensors)


@pytest.mark.parametrize(("q_len", "k_len", "block_size"), [(17, 17, 4), (10, 23, 8), (23, 10, 5), (8, 8, 64)])
def test_tiled_attention_gradients_equal_naive_attention(q_len, k_len, block_size):
    g = torch.Generator().manual_seed(q_len + k_len)
    query, key, value = _qkv(g, 4, 1, q_len=q_len, k_len=k_len)  # key/value broadcast over 4 heads
    mask = torch.rand(2, 1, q_len, k_len, generator=g) > 0.2
    weight = torch.randn(2, 4, q_len, 5, generator=g, dtype=torch.float64)
    ours = [t.clone().requires_grad_() for t in (query, key, value)]
    theirs = [t.clone().requires_grad_() for t in (query, key, value)]
    out = ac.tiled_attention(*ours, block_size=block_size, is_causal=True, mask=mask)
    (out * weight).sum().backward()
    ref_mask = mask & torch.ones(q_len, k_len, dtype=torch.bool).tril()
    ref, _ = ac.scaled_dot_product_attention(*theirs, mask=ref_mask)
    (ref * weight).sum().backward()
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for mine, reference in zip(ours, theirs):
        assert mine.grad.shape == reference.grad.shape
        torch.testing.assert_close(mine.grad, reference.grad, rtol=0, atol=1e-10)


def test_tiled_attention_training_memory_is_a_fraction_of_naive():
    n, d = 1024, 32
    g = torch.Generator().manual_seed(5)
    attentions = {"naive": lambda q, k, v: ac.scaled_dot_product_attention(q, k, v)[0],
                  "tiled": lambda q, k, v: ac.tiled_attention(q, k, v, block_size=64)}
    peaks = {}
    for name, attention in attentions.items():
        q, k, v = (torch.randn(1, 1, n, d, generator=g).requires_grad_() for _ in range(3))
        grad = torch.randn(1, 1, n, d, generator=g)
        _, peaks[name] = measure_peak_memory(lambda: attention(q, k, v).backward(grad))  # noqa: B023
    assert peaks["naive"] >= 2 * n * n * 4  # scores and weights, at least
    assert peaks["tiled"] < peaks["naive"] / 8


def test_tiled_attention_rejects_bad_mask_and_flags():
    q = torch.randn(2, 5, 8)
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        ac.tiled_attention(q, q, q, is_causal=1)
    with pytest.raises(ValueError, match="does not broadcast"):
        ac.tiled_attention(q, q, q, mask=torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="dtype torch.bool"):
        ac.tiled_attention(q, q, q, mask=torch.ones(5, 5))
