"""LayerNorm and Dropout written from scratch behave like nn.LayerNorm and nn.Dropout."""

import pytest
import torch
from torch import nn

from attention_course import Dropout, LayerNorm


def _layer_norm_pair(d_model, dtype, seed=0):
    torch.manual_seed(seed)
    reference = nn.LayerNorm(d_model, dtype=dtype)
    with torch.no_grad():
        reference.weight.normal_()
        reference.bias.normal_()
    ours = LayerNorm(d_model).to(dtype)
    with torch.no_grad():
        ours.weight.copy_(reference.weight)
        ours.bias.copy_(reference.bias)
    return reference, ours


def test_layer_norm_parameters():
    norm = LayerNorm(6)
    names = dict(norm.named_parameters())
    assert set(names) == {"weight", "bias"}
    assert torch.equal(norm.weight, torch.ones(6)) and torch.equal(norm.bias, torch.zeros(6))
    assert norm.weight.requires_grad and norm.bias.requires_grad
    assert norm.eps == 1e-5


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("std", [1.0, 1e-3])
def test_layer_norm_matches_torch_values_and_gradients(dtype, atol, std):
    reference, ours = _layer_norm_pair(16, dtype)
    g = torch.Generator().manual_seed(1)
    # with std 1e-3 the variance (1e-6) is smaller than eps: eps inside the square root matters a lot here
    x = (0.5 * std + std * torch.randn(4, 5, 16, generator=g)).to(dtype)
    x_ref = x.clone().requires_grad_(True)
    x_ours = x.clone().requires_grad_(True)
    out_ref, out_ours = reference(x_ref), ours(x_ours)
    torch.testing.assert_close(out_ours, out_ref, rtol=0, atol=atol)
    grad = torch.randn(out_ref.shape, generator=g).to(dtype)
    out_ref.backward(grad)
    out_ours.backward(grad)
    grad_atol = 1e-8 if dtype == torch.float64 else 1e-3
    scale = 1.0 / std  # the input gradient grows like 1/std
    torch.testing.assert_close(x_ours.grad / scale, x_ref.grad / scale, rtol=0, atol=grad_atol)
    torch.testing.assert_close(ours.weight.grad, reference.weight.grad, rtol=0, atol=grad_atol * 10)
    torch.testing.assert_close(ours.bias.grad, reference.bias.grad, rtol=0, atol=grad_atol * 10)


def test_layer_norm_normalises_each_token():
    norm = LayerNorm(32).double()
    x = torch.randn(10, 32, dtype=torch.float64) * 5 + 2
    y = norm(x)
    torch.testing.assert_close(y.mean(-1), torch.zeros(10, dtype=torch.float64), rtol=0, atol=1e-12)
    biased_var = x.var(-1, correction=0)
    torch.testing.assert_close(y.var(-1, correction=0), biased_var / (biased_var + 1e-5), rtol=0, atol=1e-12)


def test_layer_norm_float32_with_a_large_mean_is_as_accurate_as_torch():
    # mean 3, std 1e-3: float32 keeps only ~4 significant digits of the deviations, for both implementations
    x = 3.0 + 1e-3 * torch.randn(4, 5, 16, generator=torch.Generator().manual_seed(2))
    truth = nn.LayerNorm(16).double()(x.double())
    reference_error = (nn.LayerNorm(16)(x) - truth).abs().max()
    our_error = (LayerNorm(16)(x) - truth).abs().max()
    assert our_error <= 2 * reference_error


def test_layer_norm_copies_custom_eps():
    reference = nn.LayerNorm(8, eps=1e-2).double()
    ours = LayerNorm(8, eps=1e-2).double()
    x = 1e-2 * torch.randn(3, 8, dtype=torch.float64)
    torch.testing.assert_close(ours(x), reference(x), rtol=0, atol=1e-10)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_statistics_match_torch(p):
    torch.manual_seed(0)
    x = torch.rand(1000, 1000) + 0.5  # never exactly zero
    ours, reference = Dropout(p), nn.Dropout(p)
    y, y_ref = ours(x), reference(x)
    # 1e6 Bernoulli draws: the standard error of the zero fraction is below 5e-4
    assert abs((y == 0).float().mean().item() - p) < 3e-3
    assert abs((y_ref == 0).float().mean().item() - p) < 3e-3
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] / (1 - p), rtol=1e-6, atol=0)
    assert abs(y.mean().item() - x.mean().item()) < 5e-3  # expectation preserved


def test_dropout_gradient_and_eval_identity():
    torch.manual_seed(0)
    dropout = Dropout(0.25)
    x = torch.randn(200, 50, requires_grad=True)
    y = dropout(x)
    y.sum().backward()
    kept = y.detach() != 0
    assert (x.grad[~kept] == 0).all() and 0.2 < (~kept).float().mean().item() < 0.3
    torch.testing.assert_close(x.grad[kept], torch.full_like(x.grad[kept], 1 / 0.75))
    dropout.eval()
    assert dropout(x) is x


def test_dropout_edge_probabilities():
    x = torch.randn(100, 10)
    assert torch.equal(Dropout(0.0)(x), x)
    zeros = Dropout(1.0)(x)
    assert torch.equal(zeros, torch.zeros_like(x)) and torch.equal(nn.Dropout(1.0)(x), zeros)


# Half precision: nn.LayerNorm accumulates mean and variance in float32; so must ours.
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)])
def test_layer_norm_in_half_precision_accumulates_in_float32(dtype, tolerance):
    """Inputs near 100: in float16 (3 significant digits) the mean eats the information the deviations carry."""
    torch.manual_seed(0)
    x = (torch.randn(8, 256) + 100).to(dtype)
    reference = nn.LayerNorm(256).double()(x.double())  # exact answer for the rounded inputs
    ours = LayerNorm(256)(x)
    theirs = nn.LayerNorm(256)(x)
    assert ours.dtype == dtype
    error = (ours.double() - reference).abs().max().item()
    assert error <= tolerance
    assert error <= (theirs.double() - reference).abs().max().item() + 1e-6
    torch.testing.assert_close(ours, theirs)


def test_layer_norm_with_half_parameters_matches_torch():
    reference, ours = _layer_norm_pair(64, torch.float32)
    reference, ours = reference.half(), ours.half()
    x = (torch.randn(4, 64) * 3 + 50).half()
    torch.testing.assert_close(ours(x), reference(x))
