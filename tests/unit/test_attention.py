"""scaled_dot_product_attention: equal to PyTorch's, and the properties attention must have."""

import math

import pytest
import torch
import torch.nn.functional as F

from attention_course import causal_mask, masked_softmax, scaled_dot_product_attention


def _qkv(*batch, lq=5, lk=7, d_k=8, d_v=6, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, lq, d_k, generator=g, dtype=dtype)
    k = torch.randn(*batch, lk, d_k, generator=g, dtype=dtype)
    v = torch.randn(*batch, lk, d_v, generator=g, dtype=dtype)
    return q, k, v


def _torch_attention(q, k, v, mask=None, scale=None):
    """Reference output and weights from F.scaled_dot_product_attention (weights: values = identity)."""
    output = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    identity = torch.eye(k.size(-2), dtype=q.dtype).expand(*k.shape[:-2], -1, -1)
    weights = F.scaled_dot_product_attention(q, k, identity, attn_mask=mask, scale=scale)
    return output, weights


@pytest.mark.parametrize("batch", [(), (3,), (2, 4)])
def test_matches_torch_without_mask(batch):
    q, k, v = _qkv(*batch)
    output, weights = scaled_dot_product_attention(q, k, v)
    ref_output, ref_weights = _torch_attention(q, k, v)
    assert output.shape == (*batch, 5, 6) and weights.shape == (*batch, 5, 7)
    torch.testing.assert_close(output, ref_output, rtol=0, atol=1e-10)
    torch.testing.assert_close(weights, ref_weights, rtol=0, atol=1e-10)


def test_matches_torch_with_custom_scale():
    q, k, v = _qkv(2)
    output, weights = scaled_dot_product_attention(q, k, v, scale=0.3)
    ref_output, ref_weights = _torch_attention(q, k, v, scale=0.3)
    torch.testing.assert_close(output, ref_output, rtol=0, atol=1e-10)
    torch.testing.assert_close(weights, ref_weights, rtol=0, atol=1e-10)
    # and the default really is 1/sqrt(d_k): it differs from scale=1
    default, _ = scaled_dot_product_attention(q, k, v)
    explicit, _ = scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(q.size(-1)))
    unscaled, _ = scaled_dot_product_attention(q, k, v, scale=1.0)
    torch.testing.assert_close(default, explicit, rtol=0, atol=0)
    assert not torch.allclose(default, unscaled)


@pytest.mark.parametrize("mask_shape", [(5, 7), (2, 1, 1, 7), (2, 3, 5, 7), (1, 5, 1)])
def test_matches_torch_with_masks(mask_shape):
    q, k, v = _qkv(2, 3)
    mask = torch.rand(mask_shape, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[..., 0] = True  # torch's reference gives NaN for fully masked rows; those are tested separately
    output, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    ref_output, ref_weights = _torch_attention(q, k, v, mask=mask)
    torch.testing.assert_close(output, ref_output, rtol=0, atol=1e-10)
    torch.testing.assert_close(weights, ref_weights, rtol=0, atol=1e-10)
    assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()


def test_matches_torch_in_float32():
    q, k, v = _qkv(2, 3, dtype=torch.float32)
    mask = causal_mask(7)[:5]
    output, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    ref_output, ref_weights = _torch_attention(q, k, v, mask=mask)
    torch.testing.assert_close(output, ref_output, rtol=0, atol=1e-5)
    torch.testing.assert_close(weights, ref_weights, rtol=0, atol=1e-5)
    assert output.dtype == weights.dtype == torch.float32


def test_worked_example_from_the_seed():
    # X = [[1,0,1,0],[0,1,0,1],[1,1,0,0]], Q = K = V = X: scores X Xᵀ / 2 and weights by hand.
    x = torch.tensor([[1.0, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]], dtype=torch.float64)
    output, weights = scaled_dot_product_attention(x, x, x)
    e = math.e
    row0 = torch.tensor([e, 1, math.sqrt(e)], dtype=torch.float64) / (e + 1 + math.sqrt(e))
    row2 = torch.tensor([math.sqrt(e), math.sqrt(e), e], dtype=torch.float64) / (2 * math.sqrt(e) + e)
    torch.testing.assert_close(weights[0], row0, rtol=0, atol=1e-12)
    torch.testing.assert_close(weights[1], row0[[1, 0, 2]], rtol=0, atol=1e-12)
    torch.testing.assert_close(weights[2], row2, rtol=0, atol=1e-12)
    torch.testing.assert_close(output, weights @ x, rtol=0, atol=1e-12)


def test_weights_are_a_distribution_over_keys():
    q, k, v = _qkv(4, lq=6, lk=9, dtype=torch.float32)
    q = q * 10  # large scores: still a distribution
    _, weights = scaled_dot_product_attention(q, k, v)
    assert (weights >= 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(4, 6), rtol=0, atol=1e-6)


def test_fully_masked_row_gives_zero_weights_zero_output_and_finite_gradients():
    q, k, v = _qkv(2, lq=4, lk=5)
    for tensor in (q, k, v):
        tensor.requires_grad_(True)
    mask = torch.ones(2, 4, 5, dtype=torch.bool)
    mask[0, 1] = False  # query 1 of batch item 0 may attend to nothing
    mask[1, :, 2:] = False
    output, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    assert torch.isfinite(output).all() and torch.isfinite(weights).all()
    assert (weights[0, 1] == 0).all() and (output[0, 1] == 0).all()
    torch.testing.assert_close(weights[0, 0].sum(), torch.tensor(1.0, dtype=torch.float64))
    (output.sum() + (weights**2).sum()).backward()
    for tensor in (q, k, v):
        assert torch.isfinite(tensor.grad).all()
    assert (q.grad[0, 1] == 0).all()  # the masked query cannot influence anything


def test_gradcheck_with_a_fully_masked_row():
    q, k, v = _qkv(2, lq=3, lk=4, d_k=3, d_v=2)
    mask = torch.tensor([[True, False, True, True], [False, False, False, False], [True, True, False, True]])
    inputs = tuple(t.clone().requires_grad_(True) for t in (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: scaled_dot_product_attention(a, b, c, mask=mask), inputs)


def test_permutation_equivariance():
    q, k, v = _qkv(lq=6, lk=6)
    perm_q = torch.randperm(6, generator=torch.Generator().manual_seed(2))
    perm_kv = torch.randperm(6, generator=torch.Generator().manual_seed(3))
    output, weights = scaled_dot_product_attention(q, k, v)
    # permuting queries permutes output rows; permuting key/value pairs together changes nothing
    permuted, _ = scaled_dot_product_attention(q[perm_q], k[perm_kv], v[perm_kv])
    torch.testing.assert_close(permuted, output[perm_q], rtol=0, atol=1e-12)
    # self-attention: f(PX) = P f(X)
    x = q
    self_out, _ = scaled_dot_product_attention(x, x, x)
    self_perm, _ = scaled_dot_product_attention(x[perm_q], x[perm_q], x[perm_q])
    torch.testing.assert_close(self_perm, self_out[perm_q], rtol=0, atol=1e-12)


def test_causal_mask_prevents_leakage_from_the_future():
    x = torch.randn(2, 6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    mask = causal_mask(6)
    output, weights = scaled_dot_product_attention(x, x, x, mask=mask)
    changed = x.clone()
    changed[:, 4:] += 10.0  # perturb positions 4 and 5
    output_changed, _ = scaled_dot_product_attention(changed, changed, changed, mask=mask)
    torch.testing.assert_close(output_changed[:, :4], output[:, :4], rtol=0, atol=0)
    assert not torch.allclose(output_changed[:, 4:], output[:, 4:])
    assert (weights.triu(diagonal=1) == 0).all()


def test_dropout_on_weights():
    torch.manual_seed(0)
    q, k, _ = _qkv(64, lq=8, lk=8, dtype=torch.float32)
    identity = torch.eye(8).expand(64, 8, 8)  # output = the dropped-out weights
    p = 0.25
    dropped, weights = scaled_dot_product_attention(q, k, identity, dropout_p=p)
    torch.testing.assert_close(weights.sum(-1), torch.ones(64, 8), rtol=0, atol=1e-6)  # returned before dropout
    zero_fraction = (dropped == 0).float().mean().item()
    assert abs(zero_fraction - p) < 0.03, zero_fraction
    kept = dropped != 0
    torch.testing.assert_close(dropped[kept], weights[kept] / (1 - p), rtol=1e-6, atol=0)
    # dropout_p = 0 is deterministic and uses the weights unchanged
    plain, _ = scaled_dot_product_attention(q, k, identity, dropout_p=0.0)
    torch.testing.assert_close(plain, weights, rtol=0, atol=0)


def test_masked_softmax_ignores_masked_scores():
    scores = torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 7.0]])
    mask = torch.tensor([[True, False, True], [False, False, False]])
    weights = masked_softmax(scores, mask)
    torch.testing.assert_close(weights[0], torch.softmax(torch.tensor([1.0, -1e9, 3.0]), -1))
    assert (weights[1] == 0).all()


# Half precision: what a GPU run under autocast feeds the library.
HALF_TOLERANCE = {torch.float16: 1.5e-3, torch.bfloat16: 1.2e-2}  # a few units in the last place of each dtype


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("masked", [False, True])
def test_half_precision_is_as_accurate_as_torch(dtype, masked):
    """Against a float64 reference on the same rounded inputs, the error is no worse than PyTorch's own."""
    q, k, v = (t.to(dtype) for t in _qkv(4, 2, lq=16, lk=16, d_k=32, d_v=32, dtype=torch.float32, seed=3))
    mask = causal_mask(16) if masked else None
    reference = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
    output, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    assert output.dtype == weights.dtype == dtype
    ours = (output.double() - reference).abs().max().item()
    theirs = (F.scaled_dot_product_attention(q, k, v, attn_mask=mask).double() - reference).abs().max().item()
    assert ours <= HALF_TOLERANCE[dtype]
    assert ours <= 1.1 * theirs + 1e-6, (ours, theirs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_never_weights_a_masked_key_whatever_the_scores(dtype):
    """Scores of -113,137 are below float16's range (-65,504): computed in float16 they would be -inf, below
    the masked fill value, and the masked key would get all the weight."""
    q = torch.full((1, 2, 8), 200.0)
    k = torch.full((1, 3, 8), -200.0)
    k[0, 2] = 200.0  # the masked key is the only one with a large positive score
    v = torch.eye(3).unsqueeze(0)
    mask = torch.tensor([[True, True, False]])
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    output, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    expected = torch.tensor([0.5, 0.5, 0.0], dtype=dtype).expand(1, 2, 3)
    assert torch.equal(weights, expected) and torch.equal(output, expected)
    torch.testing.assert_close(output, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    # Unmasked, the same out-of-range scores give a finite answer, not NaN.
    output, weights = scaled_dot_product_attention(q, k[:, :2], v[:, :2])
    assert torch.isfinite(output).all() and torch.equal(weights, torch.full((1, 2, 2), 0.5, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_masked_softmax_of_half_scores_is_computed_in_float32(dtype):
    scores = torch.tensor([[1000.0, 1000.5, -60000.0, 3.0]]).to(dtype)
    mask = torch.tensor([True, True, True, False])
    weights = masked_softmax(scores, mask)
    assert weights.dtype == dtype
    expected = torch.softmax(scores[:, :3].float(), dim=-1).to(dtype)
    assert torch.equal(weights[:, :3], expected) and weights[0, 3] == 0
    # Every key blocked: zeros, as in float32.
    assert torch.equal(masked_softmax(scores, torch.zeros(4, dtype=torch.bool)), torch.zeros_like(scores))


def test_masked_key_gets_zero_weight_even_below_the_fill_value():
    """An allowed score of -inf (an overflow upstream) must not hand the weight to a blocked key."""
    scores = torch.tensor([[-float("inf"), 0.0, 5.0]])
    weights = masked_softmax(scores, torch.tensor([True, True, False]))
    torch.testing.assert_close(weights, torch.tensor([[0.0, 1.0, 0.0]]))


def test_autocast_does_not_push_the_scores_back_to_half():
    q, k, v = _qkv(2, lq=4, lk=5, d_k=8, d_v=8, dtype=torch.float32)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        output, weights = scaled_dot_product_attention(q * 100, k * 100, v)
    reference, _ = scaled_dot_product_attention(q * 100, k * 100, v)
    assert output.dtype == torch.float32
    torch.testing.assert_close(output, reference)


@pytest.mark.parametrize(("dtypes", "names"), [
    ((torch.float32, torch.float16, torch.float16), "query torch.float32, key torch.float16"),
    ((torch.float16, torch.float16, torch.bfloat16), "value torch.bfloat16"),
])
def test_mixed_dtypes_raise_a_type_error_naming_them(dtypes, names):
    q, k, v = (t.to(dtype) for t, dtype in zip(_qkv(2), dtypes))
    with pytest.raises(TypeError, match=names):
        scaled_dot_product_attention(q, k, v)


def test_integer_inputs_and_scores_are_refused():
    q, k, v = (t.long() for t in _qkv(2))
    with pytest.raises(TypeError, match="query must be a floating-point tensor, got dtype torch.int64"):
        scaled_dot_product_attention(q, k, v)
    with pytest.raises(TypeError, match="floating-point"):
        masked_softmax(torch.ones(2, 3, dtype=torch.long))


def test_masked_softmax_values_and_gradients_equal_the_masked_fill_formulation():
    """The torch.where form is bitwise the masked_fill(~mask, ...) one: values and gradients, empty rows too."""
    g = torch.Generator().manual_seed(0)
    scores = (3 * torch.randn(2, 3, 5, 5, generator=g, dtype=torch.float64)).requires_grad_()
    mask = causal_mask(5).clone()
    mask[1] = False  # a query row with no allowed key
    upstream = torch.randn(2, 3, 5, 5, generator=g, dtype=torch.float64)

    reference_scores = scores.detach().clone().requires_grad_()
    filled = reference_scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    reference = torch.softmax(filled, dim=-1).masked_fill(~mask, 0.0)
    reference.backward(upstream)

    ours = masked_softmax(scores, mask)
    ours.backward(upstream)
    assert torch.equal(ours, reference)
    assert torch.equal(scores.grad, reference_scores.grad)
    assert torch.equal(ours[..., 1, :], torch.zeros(2, 3, 5, dtype=torch.float64))
