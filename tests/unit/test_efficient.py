"""Tests of making attention fast (cost, tiled, kv_cache, incremental): cost model, peak-memory measurement, online softmax, tiled attention,
KV cache and cached greedy decoding."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import attention_course as ac
from attention_course import (
    DecodingCache,
    KVCache,
    cached_greedy_decode,
    cached_self_attention,
    decode_step,
    kv_cache_bytes,
    layer_macs,
    measure_peak_memory,
    online_softmax,
    online_softmax_update,
    tiled_attention,
    tiled_attention_step,
)
from attention_course.decoding import greedy_decode

TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10}


def _qkv(generator, batch_shape, q_len, k_len, d_k=16, d_v=12, dtype=torch.float64, scale=1.0):
    query = torch.randn(*batch_shape, q_len, d_k, generator=generator, dtype=dtype) * scale
    key = torch.randn(*batch_shape, k_len, d_k, generator=generator, dtype=dtype) * scale
    value = torch.randn(*batch_shape, k_len, d_v, generator=generator, dtype=dtype)
    return query, key, value


# --- cost -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("length", "d_model", "d_ff"), [(37, 64, 256), (5, 32, 48), (128, 16, 64)])
def test_layer_macs_match_counted_flops_of_an_encoder_layer(length, d_model, d_ff):
    layer = ac.EncoderLayer(d_model, 4, d_ff, dropout=0.0).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        layer(torch.randn(2, length, d_model))
    # FlopCounterMode counts 2 FLOPs per multiply-add of every matrix product; batch 2 doubles the work.
    assert counter.get_total_flops() == 2 * 2 * sum(layer_macs(length, d_model, d_ff).values())


def test_layer_macs_cross_attention_counts_keys_separately():
    attention = ac.MultiHeadAttention(32, 4).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        attention(torch.randn(1, 7, 32), torch.randn(1, 19, 32), torch.randn(1, 19, 32))
    macs = layer_macs(7, 32, 1, key_length=19)
    assert counter.get_total_flops() == 2 * (macs["projections"] + macs["scores"] + macs["weighted_sum"])
    assert macs["scores"] == 7 * 19 * 32


def test_layer_macs_quadratic_and_linear_parts():
    small, large = layer_macs(100, 64, 256), layer_macs(200, 64, 256)
    assert large["scores"] == 4 * small["scores"] and large["weighted_sum"] == 4 * small["weighted_sum"]
    assert large["projections"] == 2 * small["projections"] and large["feed_forward"] == 2 * small["feed_forward"]
    assert small["scores"] == 100 * 100 * 64 and small["projections"] == 4 * 100 * 64 * 64


def test_kv_cache_bytes_matches_a_filled_decoding_cache():
    torch.manual_seed(0)
    model = ac.Transformer(20, 20, d_model=32, num_heads=4, num_encoder_layers=1, num_decoder_layers=3,
                           d_ff=64, dropout=0.0).eval()
    src = torch.randint(0, 20, (2, 6))
    with torch.no_grad():
        cache = DecodingCache(model, model.encode(src))
        for step in range(5):
            decode_step(model, torch.full((2, 1), step), cache)
    held = sum(c.keys.nbytes + c.values.nbytes for c in cache.self_attention)
    assert held == kv_cache_bytes(3, 4, 8, 5, batch=2, bytes_per_value=4)
    assert kv_cache_bytes(3, 1, 8, 5, batch=2, bytes_per_value=4) * 4 == held  # multi-query: one head of four


# --- peak memory --------------------------------------------------------------------------------------------
def test_measure_peak_memory_sees_a_peak_not_a_total():
    n = 1_000_000  # 4 MB in float32

    def two_temporaries_one_at_a_time():
        first = torch.ones(n)
        second = first * 2  # first and second coexist: 8 MB
        del first
        third = second + 1  # second and third coexist: 8 MB again, never 12 MB
        del second
        return third.sum()

    result, peak = measure_peak_memory(two_temporaries_one_at_a_time)
    assert float(result) == 3.0 * n
    assert 2 * 4 * n <= peak < 3 * 4 * n


def test_measure_peak_memory_counts_no_cuda_library_workspace(monkeypatch):
    """The first product on a GPU allocates cuBLAS's workspace; it must not land in the first measurement."""
    if not torch.cuda.is_available():
        # The warm-up itself runs on any machine: check that it is called, with the measured device.
        import attention_course.cost as cost

        warmed = []
        monkeypatch.setattr(cost, "_warm_cuda_libraries", warmed.append)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 123)
        assert measure_peak_memory(lambda: "done", "cuda") == ("done", 123)
        assert warmed == [torch.device("cuda")]
        return
    # On a GPU, in a fresh process (a warm one has its workspace already): n = 512 must not look larger than
    # n = 1024 because it came first.
    import subprocess
    import sys

    script = (
        "import torch, attention_course as ac\n"
        "from attention_course import measure_peak_memory\n"
        "peaks = []\n"
        "for n in (512, 1024):\n"
        "    q = torch.randn(1, 1, n, 64, device='cuda')\n"
        "    peaks.append(measure_peak_memory(lambda: ac.scaled_dot_product_attention(q, q, q)[0], 'cuda')[1])\n"
        "print(peaks[0], peaks[1])\n"
    )
    first, second = map(int, subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                                            text=True).stdout.split())
    assert first < second / 2, (first, second)  # scores alone grow 4x from n = 512 to 1024


def test_tiled_attention_never_holds_the_score_matrix():
    generator = torch.Generator().manual_seed(0)
    query, key, value = _qkv(generator, (1,), 768, 768, d_k=32, d_v=32, dtype=torch.float32)
    score_bytes = 768 * 768 * 4
    with torch.no_grad():
        _, naive_peak = measure_peak_memory(lambda: ac.scaled_dot_product_attention(query, key, value)[0])
        _, tiled_peak = measure_peak_memory(lambda: tiled_attention(query, key, value, block_size=64))
    assert naive_peak >= score_bytes
    assert tiled_peak < score_bytes / 8


# --- online softmax -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("block_sizes", [[3, 5, 1, 4], [13], [1] * 13, [6, 7]])
def test_online_softmax_update_gives_the_log_sum_exp(block_sizes):
    generator = torch.Generator().manual_seed(1)
    scores = torch.randn(4, 13, generator=generator, dtype=torch.float64) * 5
    running_max = torch.full((4,), -math.inf, dtype=torch.float64)
    running_sum = torch.zeros(4, dtype=torch.float64)
    start = 0
    for size in block_sizes:
        running_max, running_sum = online_softmax_update(running_max, running_sum, scores[:, start:start + size])
        start += size
    torch.testing.assert_close(running_max, scores.amax(dim=-1), rtol=0, atol=0)
    torch.testing.assert_close(running_max + running_sum.log(), torch.logsumexp(scores, dim=-1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("block_size", [1, 4, 7, 64])
def test_online_softmax_equals_softmax(dtype, block_size):
    generator = torch.Generator().manual_seed(2)
    scores = torch.randn(3, 5, 29, generator=generator, dtype=dtype) * 10
    scores[0, 0, :] += 1e4  # would overflow exp() without the running maximum
    scores[1, 2, 10:] = -math.inf  # masked scores
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(online_softmax(scores, block_size), torch.softmax(scores, -1), rtol=0, atol=tol)


def test_online_softmax_fully_masked_row_is_zero_not_nan():
    scores = torch.tensor([[-math.inf, -math.inf, -math.inf], [0.0, 1.0, -math.inf]])
    weights = online_softmax(scores, block_size=2)
    assert torch.equal(weights[0], torch.zeros(3))
    torch.testing.assert_close(weights[1], torch.softmax(scores[1], -1))


# --- tiled attention ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    ("batch_shape", "q_len", "k_len", "block_size"),
    [
        ((2, 3), 50, 50, 16),  # lengths not divisible by the block
        ((2, 3), 64, 64, 16),  # divisible
        ((1, 2), 13, 70, 8),  # fewer queries than keys
        ((1, 2), 70, 13, 8),  # more queries than keys
        ((), 33, 33, 5),  # no batch dims at all
        ((2, 2, 2), 9, 11, 4),  # three batch dims
        ((2,), 7, 7, 1),  # one-element blocks
        ((2,), 10, 12, 128),  # one block larger than everything
    ],
)
def test_tiled_attention_equals_torch_sdpa(dtype, causal, batch_shape, q_len, k_len, block_size):
    generator = torch.Generator().manual_seed(q_len * 100 + k_len)
    query, key, value = _qkv(generator, batch_shape, q_len, k_len, dtype=dtype)
    expected = F.scaled_dot_product_attention(query, key, value, is_causal=causal)
    actual = tiled_attention(query, key, value, causal=causal, block_size=block_size)
    assert actual.shape == expected.shape and actual.dtype == dtype
    torch.testing.assert_close(actual, expected, rtol=0, atol=TOLERANCE[dtype])


def test_tiled_attention_causal_is_top_left_aligned_when_lengths_differ():
    generator = torch.Generator().manual_seed(3)
    query, key, value = _qkv(generator, (1,), 4, 9)
    output = tiled_attention(query, key, value, causal=True, block_size=2)
    for i in range(4):  # query i sees keys 0..i, whatever the key length
        expected = F.scaled_dot_product_attention(query[:, i:i + 1], key[:, :i + 1], value[:, :i + 1])
        torch.testing.assert_close(output[:, i:i + 1], expected, rtol=0, atol=1e-12)


def test_tiled_attention_stable_for_large_scores_custom_scale_and_broadcast():
    generator = torch.Generator().manual_seed(4)
    query, key, value = _qkv(generator, (2, 4), 40, 40, dtype=torch.float32, scale=30.0)
    key, value = key[:, :1], value[:, :1]  # one key/value head shared by all four query heads
    expected = F.scaled_dot_product_attention(query, key.expand(2, 4, 40, 16), value.expand(2, 4, 40, 12), scale=0.5)
    actual = tiled_attention(query, key, value, block_size=16, scale=0.5)
    assert torch.isfinite(actual).all()
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-4)  # scores up to ~1e4: float32 rounding


def test_tiled_attention_gradients_equal_torch_sdpa():
    generator = torch.Generator().manual_seed(5)
    tensors = _qkv(generator, (2,), 21, 17)
    ours = [t.clone().requires_grad_() for t in tensors]
    theirs = [t.clone().requires_grad_() for t in tensors]
    weight = torch.randn(2, 21, 12, generator=generator, dtype=torch.float64)
    (tiled_attention(*ours, causal=True, block_size=6) * weight).sum().backward()
    (F.scaled_dot_product_attention(*theirs, is_causal=True) * weight).sum().backward()
    for mine, reference in zip(ours, theirs):
        torch.testing.assert_close(mine.grad, reference.grad, rtol=0, atol=1e-10)


def test_tiled_attention_without_keys_gives_zeros_not_nan():
    query = torch.randn(2, 5, 8)
    output = tiled_attention(query, torch.randn(2, 0, 8), torch.randn(2, 0, 3), block_size=2)
    assert torch.equal(output, torch.zeros(2, 5, 3))


def test_tiled_attention_step_key_blocks_in_any_order():
    generator = torch.Generator().manual_seed(6)
    query, key, value = _qkv(generator, (3,), 8, 24, scale=3.0)
    expected = F.scaled_dot_product_attention(query, key, value)
    scale = 1 / math.sqrt(16)
    for order in ([0, 1, 2], [2, 0, 1]):  # the rescaling makes the result independent of the order
        state = (torch.zeros(3, 8, 12, dtype=torch.float64), torch.full((3, 8), -math.inf, dtype=torch.float64),
                 torch.zeros(3, 8, dtype=torch.float64))
        for block in order:
            blocks = slice(8 * block, 8 * block + 8)
            state = tiled_attention_step(*state, query, key[:, blocks], value[:, blocks], scale)
        accumulator, _, running_sum = state
        torch.testing.assert_close(accumulator / running_sum[..., None], expected, rtol=0, atol=1e-12)


def test_tiled_attention_step_masked_positions_contribute_nothing():
    generator = torch.Generator().manual_seed(7)
    query, key, value = _qkv(generator, (), 4, 6)
    mask = torch.rand(4, 6, generator=generator) > 0.4
    mask[:, 0] = True
    state = (torch.zeros(4, 12, dtype=torch.float64), torch.full((4,), -math.inf, dtype=torch.float64),
             torch.zeros(4, dtype=torch.float64))
    accumulator, _, running_sum = tiled_attention_step(*state, query, key, value, 0.25, mask)
    expected, _ = ac.scaled_dot_product_attention(query, key, value, mask=mask, scale=0.25)
    torch.testing.assert_close(accumulator / running_sum[:, None], expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"block_size": 0}, ValueError, "block_size must be at least 1, got 0"),
        ({"block_size": -3}, ValueError, "block_size must be at least 1"),
        ({"block_size": 2.5}, TypeError, "block_size must be an int"),
        ({"block_size": True}, TypeError, "block_size must be an int"),
        ({"causal": 1}, TypeError, "causal must be a bool"),
    ],
)
def test_tiled_attention_rejects_bad_arguments(kwargs, error, fragment):
    query = torch.randn(2, 5, 8)
    with pytest.raises(error, match=fragment):
        tiled_attention(query, query, query, **kwargs)


@pytest.mark.parametrize(
    ("shapes", "fragment"),
    [
        (((2, 5, 8), (2, 6, 4), (2, 6, 8)), r"query \(2, 5, 8\) \(d_k=8\) and key \(2, 6, 4\) \(d_k=4\)"),
        (((2, 5, 8), (2, 6, 8), (2, 7, 8)), r"key \(2, 6, 8\) \(Lk=6\) and value \(2, 7, 8\) \(Lk=7\)"),
        (((2, 5, 8), (3, 6, 8), (3, 6, 8)), "do not broadcast"),
        (((8,), (6, 8), (6, 8)), r"query must have at least 2 dimensions \(\.\.\., length, features\), got shape \(8,\)"),
    ],
)
def test_tiled_attention_rejects_mismatched_shapes(shapes, fragment):
    tensors = [torch.randn(*shape) for shape in shapes]
    with pytest.raises(ValueError, match=fragment):
        tiled_attention(*tensors)


def test_tiled_attention_rejects_bad_dtypes():
    query = torch.randn(5, 8)
    with pytest.raises(TypeError, match="floating-point"):
        tiled_attention(query.long(), query, query)
    with pytest.raises(TypeError, match="share one dtype"):
        tiled_attention(query, query.double(), query)


def test_online_softmax_update_rejects_mismatched_state():
    with pytest.raises(ValueError, match=r"running_max \(3,\)"):
        online_softmax_update(torch.zeros(3), torch.zeros(4), torch.zeros(4, 5))
    with pytest.raises(ValueError, match="block_size must be at least 1"):
        online_softmax(torch.zeros(2, 3), block_size=0)


# --- KV cache -----------------------------------------------------------------------------------------------
def test_kv_cache_append_concatenates_along_length():
    cache = KVCache()
    assert len(cache) == 0
    first_k, first_v = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 3, 5)
    keys, values = cache.append(first_k, first_v)
    assert torch.equal(keys, first_k) and len(cache) == 3
    new_k, new_v = torch.randn(2, 4, 1, 8), torch.randn(2, 4, 1, 5)
    keys, values = cache.append(new_k, new_v)
    assert keys.shape == (2, 4, 4, 8) and values.shape == (2, 4, 4, 5) and len(cache) == 4
    assert torch.equal(keys[:, :, :3], first_k) and torch.equal(keys[:, :, 3:], new_k)
    assert torch.equal(values[:, :, :3], first_v) and torch.equal(values[:, :, 3:], new_v)


def test_kv_cache_rejects_mismatched_shapes():
    cache = KVCache()
    with pytest.raises(ValueError, match=r"keys must have shape \(batch, heads, new_length, d_head\)"):
        cache.append(torch.randn(4, 3, 8), torch.randn(4, 3, 8))
    with pytest.raises(ValueError, match="must agree on"):
        cache.append(torch.randn(2, 4, 3, 8), torch.randn(2, 4, 2, 8))
    cache.append(torch.randn(2, 4, 3, 8), torch.randn(2, 4, 3, 8))
    with pytest.raises(ValueError, match=r"do not match the cached keys of shape \(2, 4, 3, 8\)"):
        cache.append(torch.randn(2, 2, 1, 8), torch.randn(2, 2, 1, 8))


def test_cached_self_attention_in_pieces_equals_full_causal_attention():
    torch.manual_seed(0)
    attention = ac.MultiHeadAttention(32, 4).double().eval()
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    expected, _ = attention(x, x, x, mask=ac.causal_mask(11))
    cache = KVCache()
    pieces = [cached_self_attention(attention, x[:, :4], cache)]  # a 4-token prompt at once
    pieces += [cached_self_attention(attention, x[:, t:t + 1], cache) for t in range(4, 9)]  # then one at a time
    pieces.append(cached_self_attention(attention, x[:, 9:], cache))  # then two at once
    torch.testing.assert_close(torch.cat(pieces, dim=1), expected, rtol=0, atol=1e-12)
    assert len(cache) == 11


def _model(norm_first: bool, dtype: torch.dtype = torch.float32) -> ac.Transformer:
    torch.manual_seed(1)
    model = ac.Transformer(30, 30, d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=3,
                           d_ff=64, dropout=0.3, norm_first=norm_first)
    return model.to(dtype).eval()  # dropout > 0 but eval mode: both paths must ignore it


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_decode_step_logits_equal_full_decoding(norm_first, dtype):
    model = _model(norm_first, dtype)
    generator = torch.Generator().manual_seed(2)
    src = torch.randint(3, 30, (3, 9), generator=generator)
    src[0, 6:] = 0  # padding in one sentence
    tgt = torch.randint(3, 30, (3, 12), generator=generator)
    src_mask = ac.padding_mask(src, 0)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        expected = model.decode(tgt, memory, ac.causal_mask(12), src_mask)
        cache = DecodingCache(model, memory, src_mask)
        steps = [decode_step(model, tgt[:, :5], cache)]  # a prefix at once, then token by token
        steps += [decode_step(model, tgt[:, t:t + 1], cache) for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), expected, rtol=0, atol=TOLERANCE[dtype])
    assert cache.position == 12


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_greedy_decode_equals_greedy_decode(norm_first):
    model = _model(norm_first)
    generator = torch.Generator().manual_seed(3)
    src = torch.randint(3, 30, (5, 8), generator=generator)
    src[1, 5:] = 0
    expected = greedy_decode(model, src, 40, bos_id=1, eos_id=2, pad_id=0)
    actual = cached_greedy_decode(model, src, 40, bos_id=1, eos_id=2, pad_id=0)
    assert torch.equal(actual, expected)
    assert actual.size(1) > 10  # a real run of many steps, not a trivial one


def test_cached_greedy_decode_stops_at_eos_like_greedy_decode():
    model = _model(False)
    src = torch.randint(3, 30, (4, 6), generator=torch.Generator().manual_seed(4))
    first = greedy_decode(model, src, 1, bos_id=1, eos_id=2)[:, 1]  # make the first choice of row 0 the eos
    eos = int(first[0])
    expected = greedy_decode(model, src, 25, bos_id=1, eos_id=eos)
    actual = cached_greedy_decode(model, src, 25, bos_id=1, eos_id=eos)
    assert torch.equal(actual, expected)
    assert bool((actual[0, 1:] == eos).all())  # finished at once, then filled with eos


def test_cached_greedy_decode_rejects_bad_input():
    model = _model(False)
    with pytest.raises(ValueError, match=r"src must be a \(batch, length\) tensor"):
        cached_greedy_decode(model, torch.zeros(5, dtype=torch.long), 4, 1, 2)
    with pytest.raises(ValueError, match="max_len must be at least 1, got 0"):
        cached_greedy_decode(model, torch.zeros(1, 5, dtype=torch.long), 0, 1, 2)
    # Bad arguments are refused exactly as greedy_decode refuses them.
    ids = torch.zeros(1, 5, dtype=torch.long)
    for args in [(ids.float(), 4, 1, 2), (ids, 4, -1, 2), (ids, 4, 1, True), (ids, 2.5, 1, 2)]:
        with pytest.raises((TypeError, ValueError)) as uncached:
            greedy_decode(model, *args)
        with pytest.raises(uncached.type, match=f"^{re.escape(str(uncached.value))}$"):
            cached_greedy_decode(model, *args)
    with pytest.raises(TypeError, match="must be an attention_course.Transformer"):
        DecodingCache(torch.nn.Linear(2, 2), torch.zeros(1, 3, 32))
