"""sample_next_token and its filters: greedy, temperature, top-k, top-p, and the errors on bad input."""

import math

import pytest
import torch

import attention_course as ac
from attention_course.sampling import chi_square_p_value, top_k_filter, top_p_filter


def test_temperature_zero_is_argmax_and_ignores_filters():
    logits = torch.randn(4, 7, 11, generator=torch.Generator().manual_seed(0))
    assert torch.equal(ac.sample_next_token(logits, temperature=0), logits.argmax(-1))
    assert torch.equal(ac.sample_next_token(logits, temperature=0, top_k=3, top_p=0.5), logits.argmax(-1))


def test_output_shape_and_dtype():
    tokens = ac.sample_next_token(torch.randn(2, 3, 5), generator=torch.Generator().manual_seed(0))
    assert tokens.shape == (2, 3) and tokens.dtype == torch.int64
    assert ac.sample_next_token(torch.randn(5)).shape == ()


def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.tensor([0.1, 2.0, -1.0, 1.5, 0.3])
    kept = top_k_filter(logits, 2)
    assert torch.isfinite(kept).tolist() == [False, True, False, True, False]
    samples = ac.sample_next_token(logits.expand(2000, 5), top_k=2, generator=torch.Generator().manual_seed(0))
    assert set(samples.tolist()) == {1, 3}


def test_top_p_keeps_the_token_that_crosses_p():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    # 0.5 < 0.6, so the second token (which crosses 0.6) is kept, the third is not
    assert torch.isfinite(top_p_filter(logits, 0.6)).tolist() == [True, True, False, False]
    # exactly reaching p: 0.5 + 0.3 = 0.8 >= 0.8, the third token is no longer needed
    assert torch.isfinite(top_p_filter(logits, 0.8)).tolist() == [True, True, False, False]
    assert torch.isfinite(top_p_filter(logits, 0.81)).tolist() == [True, True, True, False]
    assert torch.isfinite(top_p_filter(logits, 0.1)).tolist() == [True, False, False, False]
    assert torch.equal(top_p_filter(logits, 1.0), logits)


def test_temperature_acts_on_logits():
    logits = torch.tensor([[2.0, 1.0, 0.0]]).expand(20000, 3)
    samples = ac.sample_next_token(logits, temperature=0.5, generator=torch.Generator().manual_seed(0))
    frequencies = torch.bincount(samples, minlength=3).double() / samples.numel()
    expected = torch.softmax(torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64) / 0.5, dim=-1)
    assert torch.allclose(frequencies, expected, atol=0.015)


def test_same_generator_same_samples():
    logits = torch.randn(8, 50)
    first = ac.sample_next_token(logits, top_p=0.9, generator=torch.Generator().manual_seed(3))
    second = ac.sample_next_token(logits, top_p=0.9, generator=torch.Generator().manual_seed(3))
    assert torch.equal(first, second)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"temperature": -0.1}, "temperature"), ({"top_k": 0}, "top_k"), ({"top_p": 0.0}, "top_p"),
     ({"top_p": 1.5}, "top_p"), ({"temperature": math.nan}, "temperature")],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ac.sample_next_token(torch.randn(3, 4), **kwargs)


def test_a_top_k_that_is_not_an_int_is_a_type_error():
    with pytest.raises(TypeError, match="top_k must be an int, got float 2.5"):
        ac.sample_next_token(torch.randn(3, 4), top_k=2.5)


def test_non_floating_logits_raise():
    with pytest.raises(ValueError, match="floating"):
        ac.sample_next_token(torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match="Tensor"):
        ac.sample_next_token([0.1, 0.2])


# --- the chi-square test of a sampler ------------------------------------------------------------------------
def test_chi_square_p_value_matches_the_closed_forms():
    # One degree of freedom: statistic 10 (two cells 10 off 20) -> p = erfc(sqrt(10 / 2)).
    p = chi_square_p_value(torch.tensor([30.0, 10.0]), torch.tensor([20.0, 20.0]))
    assert p == pytest.approx(math.erfc(math.sqrt(5.0)), rel=1e-9)
    # Two degrees of freedom: p = exp(-statistic / 2); here the statistic is 200 / 30.
    p = chi_square_p_value(torch.tensor([40.0, 20.0, 30.0]), torch.tensor([30.0, 30.0, 30.0]))
    assert p == pytest.approx(math.exp(-(200 / 30) / 2), rel=1e-9)
    assert chi_square_p_value(torch.tensor([25.0, 25.0]), torch.tensor([25.0, 25.0])) == 1.0


def test_chi_square_p_value_pools_rare_cells_and_refuses_impossible_draws():
    # Two rare cells (expected 2 each) are pooled into one expected 4 that holds the 4 drawn: a perfect fit
    # (unpooled, the statistic would be 4 on three degrees of freedom, p about 0.26).
    pooled = chi_square_p_value(torch.tensor([48.0, 48.0, 0.0, 4.0]), torch.tensor([48.0, 48.0, 2.0, 2.0]))
    assert pooled == pytest.approx(1.0)
    # A draw of an outcome the distribution never gives is a certain rejection.
    assert chi_square_p_value(torch.tensor([50.0, 49.0, 1.0]), torch.tensor([50.0, 50.0, 0.0])) == 0.0


def test_chi_square_p_value_refuses_bad_input():
    with pytest.raises(TypeError, match="counts"):
        chi_square_p_value([1.0, 2.0], torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="same shape"):
        chi_square_p_value(torch.ones(3), torch.ones(2))
    with pytest.raises(ValueError, match="same total"):
        chi_square_p_value(torch.tensor([10.0, 10.0]), torch.tensor([0.5, 0.5]))
    with pytest.raises(ValueError, match="non-negative"):
        chi_square_p_value(torch.tensor([-1.0, 3.0]), torch.tensor([1.0, 1.0]))
