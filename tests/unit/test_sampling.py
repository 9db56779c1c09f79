"""sample_next_token and its filters: greedy, temperature, top-k, top-p, and the errors on bad input."""

import math

import pytest
import torch

import attention_course as ac
from attention_course.sampling import top_k_filter, top_p_filter


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
     ({"top_p": 1.5}, "top_p"), ({"top_k": 2.5}, "top_k"), ({"temperature": math.nan}, "temperature")],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ac.sample_next_token(torch.randn(3, 4), **kwargs)


def test_non_floating_logits_raise():
    with pytest.raises(ValueError, match="floating"):
        ac.sample_next_token(torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match="Tensor"):
        ac.sample_next_token([0.1, 0.2])
