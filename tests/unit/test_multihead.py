"""MultiHeadAttention equals nn.MultiheadAttention with copied weights (True = may attend vs True = blocked)."""

import pytest
import torch
from torch import nn

from attention_course import MultiHeadAttention, causal_mask, padding_mask
from attention_course.benchmarks import BENCHMARKS


def _pair(d_model=16, heads=4, bias=True, dtype=torch.float64, batch_first=True, seed=0):
    torch.manual_seed(seed)
    reference = nn.MultiheadAttention(d_model, heads, bias=bias, batch_first=batch_first, dtype=dtype).eval()
    if bias:  # non-zero biases, so that copying them is tested
        with torch.no_grad():
            reference.in_proj_bias.normal_()
            reference.out_proj.bias.normal_()
    return reference, MultiHeadAttention.from_torch(reference).eval()


def _inputs(lq=5, lk=7, d_model=16, dtype=torch.float64, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, lq, d_model, generator=g, dtype=dtype)
    memory = torch.randn(3, lk, d_model, generator=g, dtype=dtype)
    return x, memory


@pytest.mark.parametrize("bias", [True, False])
def test_self_attention_matches_torch(bias):
    reference, mha = _pair(bias=bias)
    x, _ = _inputs()
    ref_out, ref_w = reference(x, x, x, average_attn_weights=False)
    out, w = mha(x, x, x)
    assert out.shape == (3, 5, 16) and w.shape == (3, 4, 5, 5)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-10)
    torch.testing.assert_close(w, ref_w, rtol=0, atol=1e-10)


def test_cross_attention_with_padding_and_attention_masks_matches_torch():
    reference, mha = _pair()
    x, memory = _inputs(lq=5, lk=7)
    tokens = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0, 0]])
    key_padding = padding_mask(tokens, pad_id=0)  # (3, 1, 1, 7), True = may attend
    attention = torch.rand(5, 7, generator=torch.Generator().manual_seed(2)) > 0.3
    attention[:, 0] = True
    ref_out, ref_w = reference(
        x, memory, memory, key_padding_mask=tokens == 0, attn_mask=~attention, average_attn_weights=False
    )
    out, w = mha(x, memory, memory, mask=key_padding & attention)
    assert w.shape == (3, 4, 5, 7)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-10)
    torch.testing.assert_close(w, ref_w, rtol=0, atol=1e-10)


def test_sequence_first_module_copies_the_same_weights():
    reference, mha = _pair(batch_first=False)
    x, memory = _inputs()
    ref_out, _ = reference(x.transpose(0, 1), memory.transpose(0, 1), memory.transpose(0, 1))
    out, _ = mha(x, memory, memory)
    torch.testing.assert_close(out, ref_out.transpose(0, 1), rtol=0, atol=1e-10)


def test_float32_and_gradients_match_torch():
    reference, mha = _pair(dtype=torch.float32)
    x, memory = _inputs(dtype=torch.float32)
    mask = causal_mask(5)
    ref_out, _ = reference(x, x, x, attn_mask=~mask)
    out, _ = mha(x, x, x, mask=mask)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-5)
    grad = torch.randn_like(out)
    ref_out.backward(grad)
    out.backward(grad)
    ref_q, ref_k, ref_v = reference.in_proj_weight.grad.chunk(3)
    torch.testing.assert_close(mha.w_q.weight.grad, ref_q, rtol=0, atol=1e-4)
    torch.testing.assert_close(mha.w_k.weight.grad, ref_k, rtol=0, atol=1e-4)
    torch.testing.assert_close(mha.w_v.weight.grad, ref_v, rtol=0, atol=1e-4)
    torch.testing.assert_close(mha.w_o.weight.grad, reference.out_proj.weight.grad, rtol=0, atol=1e-4)


def test_split_and_merge_heads():
    mha = MultiHeadAttention(12, 3)
    x = torch.randn(2, 5, 12)
    heads = mha.split_heads(x)
    assert heads.shape == (2, 3, 5, 4)
    for h in range(3):
        torch.testing.assert_close(heads[:, h], x[..., 4 * h : 4 * h + 4], rtol=0, atol=0)
    torch.testing.assert_close(mha.merge_heads(heads), x, rtol=0, atol=0)


def test_self_attention_is_permutation_equivariant():
    _, mha = _pair()
    x, _ = _inputs(lq=6)
    perm = torch.randperm(6, generator=torch.Generator().manual_seed(5))
    out, _ = mha(x, x, x)
    out_perm, _ = mha(x[:, perm], x[:, perm], x[:, perm])
    torch.testing.assert_close(out_perm, out[:, perm], rtol=0, atol=1e-12)


def test_attention_dropout_only_in_training():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, dropout=0.5)
    x, _ = _inputs(dtype=torch.float32)
    mha.train()
    first, w1 = mha(x, x, x)
    second, _ = mha(x, x, x)
    assert not torch.allclose(first, second)
    torch.testing.assert_close(w1.sum(-1), torch.ones(3, 4, 5))  # returned weights are before dropout
    mha.eval()
    third, _ = mha(x, x, x)
    fourth, _ = mha(x, x, x)
    torch.testing.assert_close(third, fourth, rtol=0, atol=0)


def test_from_torch_keeps_dropout_and_mode():
    reference = nn.MultiheadAttention(8, 2, dropout=0.2)
    mha = MultiHeadAttention.from_torch(reference)
    assert mha.dropout == 0.2 and mha.training
    assert MultiHeadAttention.from_torch(reference.eval()).training is False


def test_benchmark_is_registered_and_reports_its_figures():
    assert BENCHMARKS["mha_vs_torch_time_ratio"] == "mha"
    from attention_course.benchmarks import mha as benchmark

    result = benchmark.run(repeats=1, warmup=0)  # a smoke test of the figures it reports, not a timing
    assert set(result) >= {"ratio", "library_ms", "torch_ms", "config"}
    assert result["ratio"] > 0 and result["library_ms"] > 0 and result["torch_ms"] > 0
    assert result["config"]["batch"] == 16 and result["config"]["threads"] == 2
