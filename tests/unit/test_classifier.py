"""The encoder-only classifier: pooling, padding, registered parameters and attention maps."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attention_course.classifier import POOLINGS, EncoderClassifier, pool_tokens


def _tokens(g: torch.Generator, lengths: list[int], vocab: int = 20, width: int | None = None) -> torch.Tensor:
    width = width or max(lengths)
    out = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        out[row, :n] = torch.randint(1, vocab, (n,), generator=g)
    return out


def test_pool_tokens_matches_a_loop_and_ignores_padding():
    g = torch.Generator().manual_seed(0)
    states = torch.randn(3, 5, 4, generator=g, dtype=torch.float64)
    keep = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    states[~keep] = 1e6  # huge values on padding: any leak shows
    for row in range(3):
        real = states[row, keep[row]]
        torch.testing.assert_close(pool_tokens(states, keep, "mean")[row], real.mean(0))
        torch.testing.assert_close(pool_tokens(states, keep, "max")[row], real.max(0).values)
        torch.testing.assert_close(pool_tokens(states, keep, "first")[row], states[row, 0])


def test_pool_tokens_rejects_bad_input():
    states = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match="pooling"):
        pool_tokens(states, torch.ones(2, 3, dtype=torch.bool), "median")
    with pytest.raises(ValueError, match=r"\(2, 3, 4\) and \(2, 4\)"):
        pool_tokens(states, torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="bool"):
        pool_tokens(states, torch.ones(2, 3))
    with pytest.raises(ValueError, match="no real token"):
        pool_tokens(states, torch.tensor([[True, True, False], [False, False, False]]))


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("norm_first", [False, True])
def test_extra_padding_changes_nothing(pooling, norm_first):
    torch.manual_seed(0)
    model = EncoderClassifier(20, 3, d_model=16, num_heads=2, num_layers=2, d_ff=32, pooling=pooling,
                              norm_first=norm_first).double().eval()
    g = torch.Generator().manual_seed(1)
    tokens = _tokens(g, [5, 3, 7])
    wider = torch.cat([tokens, torch.zeros(3, 4, dtype=torch.long)], dim=1)
    logits = model(tokens)
    assert logits.shape == (3, 3)
    torch.testing.assert_close(model(wider), logits, rtol=0, atol=1e-12)


def test_padding_is_masked_in_attention():
    torch.manual_seed(0)
    model = EncoderClassifier(20, 2, d_model=16, num_heads=4, num_layers=3, d_ff=32).eval()
    tokens = _tokens(torch.Generator().manual_seed(2), [6, 2], width=6)
    model(tokens)
    maps = model.attention_maps()
    assert len(maps) == 3
    for weights in maps:
        assert weights.shape == (2, 4, 6, 6)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 6))
        assert (weights[1, :, :, 2:] == 0).all(), "padded keys must get zero weight"


def test_modules_are_built_once_and_all_of_them_learn():
    """The seed's bug (layers created inside forward) would make outputs random and leave nothing to train."""
    torch.manual_seed(0)
    model = EncoderClassifier(20, 2, d_model=16, num_heads=2, num_layers=1, d_ff=32, dropout=0.0)
    tokens = _tokens(torch.Generator().manual_seed(3), [4, 5, 6, 3])
    torch.testing.assert_close(model(tokens), model(tokens), rtol=0, atol=0)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    assert len(before) > 10
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    F.cross_entropy(model(tokens), torch.tensor([0, 1, 1, 0])).backward()
    optimiser.step()
    unchanged = [name for name, p in model.named_parameters() if torch.equal(p, before[name])]
    assert unchanged == [], f"parameters that received no update: {unchanged}"


def test_it_fits_a_small_batch():
    """Cross-entropy over two logits drives a tiny batch to zero errors: the whole path is trainable."""
    torch.manual_seed(0)
    model = EncoderClassifier(12, 2, d_model=16, num_heads=2, num_layers=1, d_ff=32, dropout=0.0)
    g = torch.Generator().manual_seed(4)
    tokens = _tokens(g, [5] * 16, vocab=12)
    labels = (tokens[:, 1] > tokens[:, 3]).long()  # needs two particular positions
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        optimiser.zero_grad()
        F.cross_entropy(model(tokens), labels).backward()
        optimiser.step()
    assert (model(tokens).argmax(-1) == labels).all()


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="pooling"):
        EncoderClassifier(10, 2, pooling="attention")
    with pytest.raises(ValueError, match="pad_id=10"):
        EncoderClassifier(10, 2, pad_id=10)
    with pytest.raises(ValueError, match="num_classes"):
        EncoderClassifier(10, 0)
    model = EncoderClassifier(10, 2, d_model=8, num_heads=2, d_ff=16)
    with pytest.raises(ValueError, match=r"\(batch, length\)"):
        model(torch.zeros(2, 3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="call the model"):
        model.attention_maps()
