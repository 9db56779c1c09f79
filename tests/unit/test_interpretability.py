"""Capturing, scoring and ablating attention heads (chapter 16), against hand-built patterns."""

from __future__ import annotations

import math

import pytest
import torch

import attention_course as ac
from attention_course.interpretability import (
    AttentionOnlyLM,
    ablate_heads,
    attention_modules,
    capture_attention,
    composition_scores,
    in_context_learning_score,
    induction_score,
    per_position_loss,
    previous_token_score,
    repeated_half_loss,
    repeated_random_tokens,
    train_on_repeats,
)


def _distinct_repeated(batch: int, half: int) -> torch.Tensor:
    """Repeated sequences whose first half has no repeated token (so each query has one induction target)."""
    g = torch.Generator().manual_seed(0)
    first = torch.stack([torch.randperm(50, generator=g)[:half] for _ in range(batch)])
    return torch.cat([first, first], dim=1)


def _perfect_induction(tokens: torch.Tensor) -> torch.Tensor:
    """(B, 1, L, L): second-half queries on the key after the earlier occurrence, others on themselves."""
    batch, length = tokens.shape
    half = length // 2
    weights = torch.zeros(batch, 1, length, length)
    for i in range(length):
        weights[:, 0, i, i - half + 1 if i >= half else i] = 1.0
    return weights


def test_repeated_random_tokens_repeat_and_follow_the_generator():
    tokens = repeated_random_tokens(5, 7, 11, torch.Generator().manual_seed(3))
    assert tokens.shape == (5, 14) and tokens.dtype == torch.long
    assert torch.equal(tokens[:, :7], tokens[:, 7:])
    expected = torch.randint(11, (5, 7), generator=torch.Generator().manual_seed(3))
    assert torch.equal(tokens[:, :7], expected)
    with pytest.raises(ValueError, match="half_length"):
        repeated_random_tokens(2, 0, 5)


def test_perfect_induction_pattern_scores_one_and_uniform_about_one_over_length():
    tokens = _distinct_repeated(3, 6)
    perfect = _perfect_induction(tokens)
    assert induction_score(perfect, tokens).item() == pytest.approx(1.0)
    length = tokens.size(1)
    uniform = torch.full((3, 2, length, length), 1.0 / length)  # every query spreads over all L keys
    assert torch.allclose(induction_score(uniform, tokens), torch.full((2,), 1.0 / length))
    # The earlier occurrence itself (one key too early) is not the induction target.
    shifted = torch.zeros_like(perfect)
    for i in range(6, length):
        shifted[:, 0, i, i - 6] = 1.0
    assert induction_score(shifted, tokens).item() == pytest.approx(0.0)


def test_induction_score_counts_every_earlier_occurrence_and_only_queries_that_have_one():
    tokens = torch.tensor([[1, 2, 1, 3, 1]])  # query 2 has target 1; query 4 has targets 1 and 3
    weights = torch.zeros(1, 1, 5, 5)
    weights[0, 0, 2, 1] = 1.0
    weights[0, 0, 4, 1], weights[0, 0, 4, 3] = 0.25, 0.25
    weights[0, 0, 0, 0] = weights[0, 0, 1, 0] = weights[0, 0, 3, 0] = 1.0  # no earlier occurrence: not scored
    assert induction_score(weights, tokens).item() == pytest.approx((1.0 + 0.5) / 2)


def test_previous_token_scores():
    length = 6
    previous = torch.zeros(2, 1, length, length)
    previous[:, 0, 0, 0] = 1.0
    for i in range(1, length):
        previous[:, 0, i, i - 1] = 1.0
    assert previous_token_score(previous).item() == pytest.approx(1.0)
    diagonal = torch.eye(length).expand(2, 1, length, length)
    assert previous_token_score(diagonal).item() == pytest.approx(0.0)
    uniform = torch.full((1, 3, length, length), 1.0 / length)
    assert torch.allclose(previous_token_score(uniform), torch.full((3,), 1.0 / length))


def test_scores_reject_wrong_shapes():
    with pytest.raises(ValueError, match=r"\(batch, heads, L, L\)"):
        previous_token_score(torch.rand(4, 4))
    with pytest.raises(ValueError, match=r"\(batch, heads, L, L\)"):
        induction_score(torch.rand(1, 2, 4, 5), torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="to match weights"):
        induction_score(torch.rand(2, 1, 4, 4), torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        induction_score(torch.rand(1, 1, 4, 4), torch.zeros(1, 4))
    with pytest.raises(ValueError, match="occurs twice"):
        induction_score(torch.rand(1, 1, 4, 4), torch.arange(4)[None])
    with pytest.raises(TypeError, match="floating-point"):
        previous_token_score(torch.ones(1, 1, 3, 3, dtype=torch.long))


def _model(layers: int = 2, seed: int = 0) -> AttentionOnlyLM:
    torch.manual_seed(seed)
    return AttentionOnlyLM(vocab_size=13, d_model=16, num_heads=4, num_layers=layers, max_len=12).eval()


def test_capture_returns_every_layer_and_leaves_outputs_unchanged():
    model = _model()
    tokens = repeated_random_tokens(3, 5, 13, torch.Generator().manual_seed(1))
    before = model(tokens)
    with capture_attention(model) as attention:
        during = model(tokens)
    assert torch.equal(before, during)
    assert len(attention) == 2 and attention.stack().shape == (2, 3, 4, 10, 10)
    assert torch.allclose(attention[1].sum(-1), torch.ones(3, 4, 10))
    assert torch.equal(attention["blocks.0.self_attention"], attention[0])
    # The weights are the module's own: recompute layer 0's from its input.
    x = model.token_embedding(tokens) + model.position_embedding(torch.arange(10))
    _, expected = model.blocks[0].self_attention(x, x, x, mask=ac.causal_mask(10))
    assert torch.allclose(attention[0], expected)
    # Hooks are gone afterwards.
    assert all(not m._forward_hooks for _, m in attention_modules(model))


def test_capture_works_on_the_encoder_decoder_and_the_decoder_only_model():
    torch.manual_seed(0)
    translator = ac.Transformer(11, 11, d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                                d_ff=32, dropout=0.0).eval()
    src, tgt = torch.randint(11, (2, 5)), torch.randint(11, (2, 4))
    with capture_attention(translator) as attention:
        translator(src, tgt)
    shapes = {name: tuple(attention[name].shape) for name in attention.names}
    assert sorted(shapes.values()) == [(2, 2, 4, 4), (2, 2, 4, 5), (2, 2, 5, 5)]
    lm = ac.DecoderOnlyLM(17, d_model=16, num_heads=2, num_layers=2, max_len=8).eval()
    tokens = torch.randint(17, (2, 8))
    with capture_attention(lm) as attention:
        lm(tokens)
    for i, block in enumerate(lm.blocks):
        assert torch.equal(attention[i], block.self_attention_weights)
    with pytest.raises(ValueError, match="no attention_course.MultiHeadAttention"):
        with capture_attention(torch.nn.Linear(2, 2)):
            pass


def _manual_logits(model: AttentionOnlyLM, tokens: torch.Tensor, layer: int, head: int,
                   replacement: torch.Tensor | None) -> torch.Tensor:
    """The model's forward pass written out, with head ``head`` of ``layer`` writing ``replacement`` (d_head,)."""
    x = model.token_embedding(tokens) + model.position_embedding(torch.arange(tokens.size(1)))
    for index, block in enumerate(model.blocks):
        attention = block.self_attention
        d_head = attention.d_head
        _, weights = attention(x, x, x, mask=ac.causal_mask(tokens.size(1)))  # (B, H, L, L)
        values = attention.w_v(x).view(*x.shape[:2], attention.num_heads, d_head).transpose(1, 2)
        heads = weights @ values  # (B, H, L, d_head)
        if index == layer and replacement is not None:
            heads[:, head] = replacement
        merged = heads.transpose(1, 2).reshape(x.shape)
        x = x + attention.w_o(merged)
    return model.unembed(x)


@torch.no_grad()
def test_zero_and_mean_ablation_change_exactly_the_chosen_head():
    model = _model()
    tokens = repeated_random_tokens(4, 5, 13, torch.Generator().manual_seed(2))
    reference = repeated_random_tokens(6, 5, 13, torch.Generator().manual_seed(3))
    clean = model(tokens)
    assert torch.allclose(_manual_logits(model, tokens, 0, 1, None), clean, atol=1e-5)  # the manual pass is right
    with ablate_heads(model, {0: [1]}):
        zeroed = model(tokens)
    assert torch.allclose(zeroed, _manual_logits(model, tokens, 0, 1, torch.zeros(4)), atol=1e-5)
    assert not torch.allclose(zeroed, clean, atol=1e-3)
    # The mean output of head 1 of layer 0 over the reference batch and its positions.
    x = model.token_embedding(reference) + model.position_embedding(torch.arange(10))
    attention = model.blocks[0].self_attention
    _, weights = attention(x, x, x, mask=ac.causal_mask(10))
    values = attention.w_v(x).view(6, 10, 4, 4).transpose(1, 2)
    mean = (weights @ values)[:, 1].mean(dim=(0, 1))  # (d_head,)
    with ablate_heads(model, {0: [1]}, mode="mean", reference=reference):
        meaned = model(tokens)
    assert torch.allclose(meaned, _manual_logits(model, tokens, 0, 1, mean), atol=1e-5)
    # Leaving the block restores the model.
    assert torch.equal(model(tokens), clean)


@torch.no_grad()
def test_ablate_heads_rejects_bad_arguments():
    model = _model()
    with pytest.raises(ValueError, match="mode"):
        with ablate_heads(model, {0: [0]}, mode="half"):
            pass
    with pytest.raises(ValueError, match="reference"):
        with ablate_heads(model, {0: [0]}, mode="mean"):
            pass
    with pytest.raises(ValueError, match="head 4"):
        with ablate_heads(model, {0: [4]}):
            pass
    with pytest.raises(ValueError, match="layer 2"):
        with ablate_heads(model, {2: [0]}):
            pass
    with pytest.raises(TypeError, match="mapping"):
        with ablate_heads(model, [0]):
            pass


def test_composition_scores_match_the_definition():
    model = _model()
    first, second = (block.self_attention for block in model.blocks)
    k = composition_scores(first, second, "k")
    assert k.shape == (4, 4)

    def head(linear: torch.nn.Linear, h: int) -> torch.Tensor:  # (d_model, d_head), x @ W
        return linear.weight[h * 4:(h + 1) * 4].T

    w_qk = head(second.w_q, 2) @ head(second.w_k, 2).T
    w_ov = head(first.w_v, 3) @ first.w_o.weight[:, 3 * 4:4 * 4].T
    expected = (w_qk @ w_ov.T).norm() / (w_qk.norm() * w_ov.norm())
    assert k[2, 3].item() == pytest.approx(expected.item(), rel=1e-5)
    assert 0 < float(composition_scores(first, second, "v").max()) <= 1
    with pytest.raises(ValueError, match="kind"):
        composition_scores(first, second, "x")


def test_losses_on_the_repeated_half_and_the_in_context_score():
    tokens = torch.tensor([[0, 1, 2, 0, 1, 2]])
    logits = torch.zeros(1, 6, 3)
    logits[0, 3:, :] = torch.tensor([[0.0, 9.0, 0.0], [0.0, 0.0, 9.0], [0.0, 0.0, 0.0]])
    losses = per_position_loss(logits, tokens)
    assert losses.shape == (5,)
    assert losses[0].item() == pytest.approx(math.log(3))
    assert repeated_half_loss(logits, tokens).item() == pytest.approx(losses[3:].mean().item())
    assert in_context_learning_score(losses, 0, 4) == pytest.approx(losses[4].item() - math.log(3))
    with pytest.raises(ValueError, match="early"):
        in_context_learning_score(losses, 3, 3)


def test_training_on_repeats_lowers_the_loss():
    model = _model(layers=1)
    log = train_on_repeats(model, 30, 13, (3, 5), batch_size=8, lr=1e-2, generator=torch.Generator().manual_seed(0))
    assert len(log.repeated) == 30 and len(log.first_half) == 30
    assert sum(log.repeated[-5:]) / 5 < sum(log.repeated[:5]) / 5
