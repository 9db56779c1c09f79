"""Which component causes an output (chapter 16): the cached forward pass, direct logit attribution, the logit
lens, activation and path patching, and the OV copying score, on the attention-only toy and on the decoder-only
model in its GPT-2 (LayerNorm, learned positions), Llama (RMSNorm, SwiGLU, rotary, grouped-query, untied) and
ALiBi/multi-query/sliding-window configurations."""

from __future__ import annotations

import pytest
import torch

import attention_course as ac
from attention_course.interpretability import (
    ActivationCache,
    AttentionOnlyLM,
    ablate_heads,
    capture_attention,
    copying_fraction,
    copying_score,
    direct_logit_attribution,
    induction_score,
    logit_lens,
    patch,
    path_patch,
    prefix_matching_score,
    run_with_cache,
)

VOCAB = 17


def _perturb(model: torch.nn.Module) -> torch.nn.Module:
    """Random norm gains and biases and random projection biases, so that every term of a sum can matter."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (ac.LayerNorm, ac.RMSNorm)):
                module.weight.copy_(1 + 0.3 * torch.randn(module.weight.shape, generator=g))
            if getattr(module, "bias", None) is not None and isinstance(module.bias, torch.nn.Parameter):
                module.bias.copy_(0.2 * torch.randn(module.bias.shape, generator=g))
    return model


def _toy(positions: str = "learned") -> AttentionOnlyLM:
    torch.manual_seed(0)
    return _perturb(AttentionOnlyLM(VOCAB, d_model=16, num_heads=4, num_layers=2, max_len=12, positions=positions))


def _decoder(config: ac.ModelConfig, positions: str = "learned", tie: bool = True) -> ac.DecoderOnlyLM:
    torch.manual_seed(0)
    model = ac.DecoderOnlyLM(VOCAB, d_model=16, num_heads=4, num_layers=2, d_ff=24, max_len=12,
                             positions=positions, tie_weights=tie, config=config)
    with torch.no_grad():
        model.token_embedding.weight.normal_(std=1.0)  # logits of order 1 rather than GPT-2's 0.02-sized ones
    return _perturb(model)


MODELS = {
    "toy": lambda: _toy(),
    "toy-rotary": lambda: _toy("rotary"),
    "gpt2": lambda: _decoder(ac.ModelConfig(feed_forward="gelu_tanh")),
    "llama": lambda: _decoder(ac.ModelConfig(positions="rotary", rotary_pairing="half", num_kv_heads=2,
                                             norm="rmsnorm", feed_forward="swiglu", bias=False),
                              positions="none", tie=False),
    "alibi-mqa-window": lambda: _decoder(ac.ModelConfig(positions="alibi", num_kv_heads=1, window=4),
                                         positions="sinusoidal"),
}
DECODERS = ["gpt2", "llama", "alibi-mqa-window"]


def _tokens(seed: int, batch: int = 3, length: int = 10) -> torch.Tensor:
    return torch.randint(VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _metric(position: int = -1, answer: int = 3, wrong: int = 5):
    return lambda logits: (logits[:, position, answer] - logits[:, position, wrong]).mean()


def _run_replacing(model, tokens: torch.Tensor, layer: int, head: int, z_head: torch.Tensor,
                   positions: list[int]) -> torch.Tensor:
    """``model(tokens)`` with head ``head`` of ``layer`` writing ``z_head`` ``(B, L, d_head)`` at ``positions``
    (a hook of the test's own on the output projection's input)."""
    attention = model.blocks[layer].self_attention
    d_head = attention.d_head

    def hook(module, args):
        merged = args[0].clone()
        merged[:, positions, head * d_head:(head + 1) * d_head] = z_head[:, positions]
        return (merged,)

    handle = attention.w_o.register_forward_pre_hook(hook)
    try:
        with torch.no_grad():
            return model(tokens)
    finally:
        handle.remove()


def _share(metric, clean: torch.Tensor, corrupted: torch.Tensor, patched: torch.Tensor) -> float:
    m_clean, m_corrupted, m_patched = (float(metric(x)) for x in (clean, corrupted, patched))
    return (m_patched - m_corrupted) / (m_clean - m_corrupted)


# ---------------------------------------------------------------------------------------------------------
# run_with_cache
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_the_cache_reproduces_the_model_and_adds_up_to_its_residual_stream(name):
    model = MODELS[name]().train()
    tokens = _tokens(0)
    logits, cache = run_with_cache(model, tokens)
    assert model.training  # the mode is restored
    model.eval()
    with torch.no_grad(), capture_attention(model) as attention:
        expected = model(tokens)
    assert torch.allclose(logits, expected, atol=1e-5)
    assert isinstance(cache, ActivationCache) and cache.num_layers == 2
    assert torch.equal(cache.embed, model.token_embedding(tokens).detach())
    assert torch.allclose(cache.resid_pre[0], cache.embed + cache.pos_embed)
    for layer, block in enumerate(model.blocks):
        assert cache.head_out[layer].shape == (3, 4, 10, 16) and cache.z[layer].shape == (3, 4, 10, 4)
        assert torch.allclose(cache.pattern[layer], attention[layer])
        # The heads' outputs and the output bias add up to the attention sublayer's output ...
        attended = cache.head_out[layer].sum(dim=1) + cache.attn_bias[layer]
        assert torch.allclose(attended, cache.attn_out[layer], atol=1e-5)
        # ... which is what the layer's attention computes from its recorded input.
        with torch.no_grad():
            again, _ = block.self_attention(*(cache.attn_in[layer],) * 3, mask=cache.masks[layer])
        assert torch.allclose(again, cache.attn_out[layer], atol=1e-6)
        mlp = 0.0 if cache.mlp_out is None else cache.mlp_out[layer]
        assert torch.allclose(cache.resid_post[layer], cache.resid_pre[layer] + cache.attn_out[layer] + mlp,
                              atol=1e-5)
        if cache.resid_mid is not None:
            assert torch.allclose(cache.resid_mid[layer], cache.resid_pre[layer] + cache.attn_out[layer], atol=1e-6)
            assert torch.allclose(cache.attn_in[layer], block.norm1(cache.resid_pre[layer]))
            assert torch.allclose(cache.mlp_out[layer], block.feed_forward(block.norm2(cache.resid_mid[layer])))
    assert torch.equal(cache.resid_pre[1], cache.resid_post[0])
    assert torch.equal(cache.final_in, cache.resid_post[-1])
    assert cache["pattern", 1] is cache.pattern[1] and cache["final_in"] is cache.final_in
    if name == "toy":
        assert torch.allclose(cache.pos_embed[0], model.position_embedding.weight[:10])
        assert cache.resid_mid is None and cache.mlp_out is None
        with pytest.raises(KeyError, match="no 'mlp_out'"):
            cache["mlp_out", 0]
    if name in ("toy-rotary", "llama"):  # rotary positions act inside attention: nothing is added
        assert torch.count_nonzero(cache.pos_embed) == 0


@pytest.mark.parametrize("name", DECODERS)
def test_each_head_writes_its_pattern_times_its_groups_values_through_its_slice_of_w_o(name):
    """Head h reads value head h // (H / H_kv) (grouped-query and multi-query attention)."""
    model = MODELS[name]().eval()
    _, cache = run_with_cache(model, _tokens(1))
    for layer, block in enumerate(model.blocks):
        attention = block.self_attention
        d_head, group = attention.d_head, attention.num_heads // attention.num_kv_heads
        with torch.no_grad():
            values = attention.w_v(cache.attn_in[layer])  # (B, L, H_kv * d_head)
        for head in range(attention.num_heads):
            kv = head // group
            value = values[..., kv * d_head:(kv + 1) * d_head]  # (B, L, d_head)
            w_o = attention.w_o.weight[:, head * d_head:(head + 1) * d_head].detach()  # (d, d_head)
            expected = cache.pattern[layer][:, head] @ value @ w_o.T
            assert torch.allclose(cache.head_out[layer][:, head], expected, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# Direct logit attribution and the logit lens
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_direct_logit_attribution_adds_up_to_the_logit_difference(name):
    model = MODELS[name]().eval()
    logits, cache = run_with_cache(model, _tokens(2))
    parts = direct_logit_attribution(cache, model, 3, 5)
    expected = logits[:, -1, 3] - logits[:, -1, 5]
    assert parts.heads.shape == (3, 2, 4) and parts.attn_bias.shape == (3, 2) and parts.embed.shape == (3,)
    assert (parts.mlps is None) == name.startswith("toy")
    assert torch.allclose(parts.logit_diff, expected, atol=1e-5)
    assert torch.allclose(parts.total(), expected, atol=1e-4)
    # One answer, wrong token and position per sequence.
    answer, wrong, position = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6]), torch.tensor([2, 9, 5])
    parts = direct_logit_attribution(cache, model, answer, wrong, position)
    rows = torch.arange(3)
    expected = logits[rows, position, answer] - logits[rows, position, wrong]
    assert torch.allclose(parts.total(), expected, atol=1e-4)
    # A single logit.
    parts = direct_logit_attribution(cache, model, 7, position=-3)
    assert torch.allclose(parts.total(), logits[:, -3, 7], atol=1e-4)
    if name == "gpt2":  # the final LayerNorm's bias is a part of its own
        bias_term = model.norm.bias.detach() @ model.lm_head.weight[7].detach()
        assert torch.allclose(parts.norm_bias, bias_term.expand(3)) and abs(float(bias_term)) > 1e-3


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_the_attribution_freezes_the_final_norm_at_the_scale_of_the_whole_stream(name):
    model = MODELS[name]().eval()
    _, cache = run_with_cache(model, _tokens(3))
    parts = direct_logit_attribution(cache, model, 3, 5)
    norm, unembed = model.norm, (model.lm_head.weight[3] - model.lm_head.weight[5]).detach()
    layernorm = name == "gpt2"

    def centred(x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(dim=-1, keepdim=True) if layernorm else x

    stream = cache.final_in[:, -1]  # (B, d)
    scale = (centred(stream).pow(2).mean(dim=-1, keepdim=True) + norm.eps).sqrt()
    head = cache.head_out[1][:, 2, -1]  # (B, d)
    by_hand = (centred(head) / scale * norm.weight.detach()) @ unembed
    assert torch.allclose(parts.heads[:, 1, 2], by_hand, atol=1e-5)
    # Reading each part with its *own* scale instead breaks the sum: the test above has power.
    components = [cache.embed[:, -1], cache.pos_embed[:, -1], *cache.head_out[0][:, :, -1].unbind(1),
                  *cache.head_out[1][:, :, -1].unbind(1), *(cache.attn_bias[i].expand(3, -1) for i in range(2)),
                  *(cache.mlp_out[i][:, -1] for i in range(2))]
    bias = 0.0 if getattr(norm, "bias", None) is None else norm.bias.detach()
    unfrozen = sum(((norm(c) - bias) @ unembed) for c in components if c.abs().sum() > 0) + parts.norm_bias
    assert not torch.allclose(unfrozen, parts.logit_diff, atol=1e-2)


def test_without_a_norm_a_last_layer_heads_attribution_is_what_ablating_it_removes():
    model = MODELS["toy"]().eval()
    tokens = _tokens(4)
    logits, cache = run_with_cache(model, tokens)
    parts = direct_logit_attribution(cache, model, 3, 5)
    for head in range(4):
        with torch.no_grad(), ablate_heads(model, {1: [head]}):
            ablated = model(tokens)
        removed = (logits[:, -1, 3] - logits[:, -1, 5]) - (ablated[:, -1, 3] - ablated[:, -1, 5])
        assert torch.allclose(parts.heads[:, 1, head], removed, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_the_logit_lens_starts_at_the_embedding_and_ends_at_the_model(name):
    model = MODELS[name]().eval()
    logits, cache = run_with_cache(model, _tokens(5))
    lens = logit_lens(cache, model)
    assert lens.shape == (3, 3, 10, VOCAB)
    assert torch.allclose(lens[-1], torch.log_softmax(logits, dim=-1), atol=1e-5)
    norm = getattr(model, "norm", torch.nn.Identity())
    unembed = model.lm_head if hasattr(model, "lm_head") else model.unembed
    with torch.no_grad():
        for reading, stream in zip(lens, [cache.resid_pre[0], *cache.resid_post]):
            assert torch.allclose(reading, torch.log_softmax(unembed(norm(stream)), dim=-1), atol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# Activation patching
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_patching_everything_recovers_all_nothing_and_the_future_recover_nothing(name):
    model = MODELS[name]()
    clean, corrupted = _tokens(6), _tokens(7)
    metric = _metric()
    for everything in [("resid_pre", 0), ("resid_pre", 1), ("resid_post", 1), [("resid_pre", 0, [0, 1, 2]),
                                                                              ("resid_pre", 0, [3, 4, 5, 6, 7, 8, 9])]]:
        assert patch(model, clean, corrupted, everything, metric) == pytest.approx(1.0, abs=1e-6)
    assert patch(model, clean, corrupted, ("resid_pre", 0, []), metric) == 0.0
    assert patch(model, clean, corrupted, [], metric) == 0.0
    # Attention is causal: a metric read at position 4 sees nothing of positions 5..9, everything of 0..4.
    early = _metric(position=4)
    assert patch(model, clean, corrupted, ("resid_pre", 0, [5, 6, 7, 8, 9]), early) == pytest.approx(0.0, abs=1e-6)
    assert patch(model, clean, corrupted, ("resid_pre", 0, [0, 1, 2, 3, 4]), early) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("name", ["toy", "llama"])
def test_head_and_pattern_patching_equal_a_run_patched_by_hand(name):
    """The clean z of a head at some positions; the clean pattern of a grouped-query head on the corrupted
    run's own values (value head h // (H / H_kv))."""
    model = MODELS[name]().eval()
    clean, corrupted = _tokens(8), _tokens(9)
    metric = _metric()
    clean_logits, clean_cache = run_with_cache(model, clean)
    corrupted_logits, corrupted_cache = run_with_cache(model, corrupted)
    layer, head = 1, 2  # llama: value head 2 // 2 = 1 (not 2 % 2 = 0)
    attention = model.blocks[layer].self_attention
    d_head, group = attention.d_head, attention.num_heads // attention.num_kv_heads
    kv = head // group
    with torch.no_grad():
        values = attention.w_v(corrupted_cache.attn_in[layer])[..., kv * d_head:(kv + 1) * d_head]
    by_pattern = clean_cache.pattern[layer][:, head] @ values  # (B, L, d_head)
    by_head = clean_cache.z[layer][:, head]

    def expected_share(z_head: torch.Tensor, positions: list[int]) -> float:
        patched = _run_replacing(model, corrupted, layer, head, z_head, positions)
        return _share(metric, clean_logits, corrupted_logits, patched)

    expected = expected_share(by_pattern, list(range(10)))
    assert patch(model, clean, corrupted, ("pattern", layer, head), metric) == pytest.approx(expected, abs=1e-6)
    assert abs(expected) > 1e-3
    expected = expected_share(by_head, [8, 9])
    assert patch(model, clean, corrupted, ("head", layer, head, [-2, -1]), metric) == pytest.approx(expected, abs=1e-6)
    assert abs(expected) > 1e-3


def _wired_toy() -> AttentionOnlyLM:
    """A 2-layer attention-only model wired by hand. Every query and key weight is zero, so each head averages
    its causal past uniformly. The stream has four 4-wide subspaces: T (dims 0-3, the one-hot token), S0, S1, R.
    Layer 0: head 0 copies T into S0, head 1 copies T into S1. Layer 1: heads 0 and 1 both copy S0 into R.
    The unembedding reads R. Everything else is zero."""
    model = AttentionOnlyLM(4, d_model=16, num_heads=4, num_layers=2, max_len=8)
    eye = torch.eye(4)
    first, second = (block.self_attention for block in model.blocks)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        model.token_embedding.weight[:, 0:4] = eye
        # Head h's value rows are w_v.weight[4h:4h+4]; its columns of the output projection w_o.weight[:, 4h:4h+4].
        first.w_v.weight[0:4, 0:4], first.w_o.weight[4:8, 0:4] = eye, eye  # head 0: T -> S0
        first.w_v.weight[4:8, 0:4], first.w_o.weight[8:12, 4:8] = eye, eye  # head 1: T -> S1
        for head in (0, 1):
            second.w_v.weight[4 * head:4 * head + 4, 4:8] = eye  # S0 -> z
            second.w_o.weight[12:16, 4 * head:4 * head + 4] = eye  # z -> R
        model.unembed.weight[:, 12:16] = eye
    return model.eval()


def test_patching_a_hand_wired_model_gives_the_shares_its_wiring_implies():
    model = _wired_toy()
    clean = torch.tensor([[0, 2, 0, 3, 0, 2, 0, 0], [2, 0, 3, 0, 0, 2, 3, 0]])
    corrupted = torch.where(clean == 0, 1, clean)  # every 0 becomes a 1
    metric = _metric(answer=0, wrong=1)
    # logit[0] - logit[1] at the last position = 2 * mean over p of S0_p · (e0 - e1), with S0_p the mean one-hot
    # token up to p: head (0, 0)'s output at position p separates the runs by d_p = 2 * (#0s up to p) / (p + 1).
    zeros = (clean == 0).double()
    d = 2 * zeros.cumsum(dim=1) / torch.arange(1, 9)
    for positions in ([0, 1, 2], [5], [1, 6, 7]):
        expected = float(d[:, positions].sum() / d.sum())
        assert patch(model, clean, corrupted, ("head", 0, 0, positions), metric) == pytest.approx(expected, abs=1e-6)
    assert patch(model, clean, corrupted, ("head", 0, 0), metric) == pytest.approx(1.0, abs=1e-6)
    assert patch(model, clean, corrupted, ("head", 0, 1), metric) == pytest.approx(0.0, abs=1e-6)  # S1: unread
    assert patch(model, clean, corrupted, ("head", 1, 0), metric) == pytest.approx(0.5, abs=1e-6)  # half of R
    assert patch(model, clean, corrupted, [("head", 1, 0), ("head", 1, 1)], metric) == pytest.approx(1.0, abs=1e-6)
    assert patch(model, clean, corrupted, ("pattern", 0, 0), metric) == pytest.approx(0.0, abs=1e-6)  # uniform
    # Path patching: head (0, 0) reaches the logits only through the values of heads (1, 0) and (1, 1), half each;
    # no query or key reads anything, and head (0, 1) is read by no one.
    for receiver in (0, 1):
        assert path_patch(model, clean, corrupted, (0, 0), (1, receiver), "v", metric) == pytest.approx(0.5, abs=1e-6)
        for receiver_input in ("q", "k"):
            assert path_patch(model, clean, corrupted, (0, 0), (1, receiver), receiver_input, metric) == \
                pytest.approx(0.0, abs=1e-6)
    assert path_patch(model, clean, corrupted, (0, 1), (1, 0), "v", metric) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="earlier layer than the receiver"):
        path_patch(model, clean, corrupted, (1, 0), (0, 0), "v", metric)
    with pytest.raises(ValueError, match="earlier layer than the receiver"):
        path_patch(model, clean, corrupted, (1, 0), (1, 1), "k", metric)


@pytest.mark.parametrize("name, receiver_input", [("toy", "q"), ("toy", "k"), ("toy", "v"), ("llama", "v")])
def test_path_patching_equals_a_receiver_recomputed_by_hand(name, receiver_input):
    """The receiver's one input is computed from the corrupted stream plus the sender's clean-minus-corrupted
    output (through norm1); its other inputs and every other head stay corrupted. Llama: head 2 reads value head
    2 // 2 = 1 (grouped-query attention), and the patched values serve the receiver only."""
    model = MODELS[name]().eval()
    clean, corrupted = _tokens(10), _tokens(11)
    metric = _metric()
    clean_logits, clean_cache = run_with_cache(model, clean)
    corrupted_logits, cache = run_with_cache(model, corrupted)
    (sender_layer, sender_head), (layer, head) = (0, 1), (1, 2)
    block = model.blocks[layer]
    attention = block.self_attention
    d_head, group = attention.d_head, attention.num_heads // attention.num_kv_heads
    difference = clean_cache.head_out[sender_layer][:, sender_head] - cache.head_out[sender_layer][:, sender_head]
    with torch.no_grad():
        patched = getattr(block, "norm1", torch.nn.Identity())(cache.resid_pre[layer] + difference)
    inputs = {"q": cache.attn_in[layer], "k": cache.attn_in[layer], "v": cache.attn_in[layer], receiver_input: patched}

    def project(linear: torch.nn.Linear, x: torch.Tensor, index: int) -> torch.Tensor:  # (B, L, d_head)
        rows = slice(index * d_head, (index + 1) * d_head)
        bias = 0.0 if linear.bias is None else linear.bias[rows]
        return (x @ linear.weight[rows].T + bias).detach()

    values = project(attention.w_v, inputs["v"], head // group)
    if name == "toy":  # no rotary: the pattern written out
        scores = project(attention.w_q, inputs["q"], head) @ project(attention.w_k, inputs["k"], head).transpose(1, 2)
        scores = (scores / d_head ** 0.5).masked_fill(~ac.causal_mask(10), float("-inf"))
        pattern = torch.softmax(scores, dim=-1)
    else:  # only the values change: the pattern is the corrupted run's
        pattern = cache.pattern[layer][:, head]
    patched_logits = _run_replacing(model, corrupted, layer, head, pattern @ values, list(range(10)))
    expected = _share(metric, clean_logits, corrupted_logits, patched_logits)
    got = path_patch(model, clean, corrupted, (sender_layer, sender_head), (layer, head), receiver_input, metric)
    assert got == pytest.approx(expected, abs=1e-5)
    assert abs(expected) > 1e-3


def test_bad_arguments_are_named():
    model = MODELS["toy"]()
    clean, corrupted = _tokens(12), _tokens(13)
    metric = _metric()
    with pytest.raises(ValueError, match="same shape"):
        patch(model, clean, corrupted[:, :9], ("resid_pre", 0), metric)
    with pytest.raises(ValueError, match="site kind"):
        patch(model, clean, corrupted, ("resid", 0), metric)
    with pytest.raises(ValueError, match=r"layer must be in 0\.\.1, got 2"):
        patch(model, clean, corrupted, ("resid_pre", 2), metric)
    with pytest.raises(TypeError, match="layer must be an int"):
        patch(model, clean, corrupted, ("resid_pre", 0.5), metric)
    with pytest.raises(ValueError, match=r"head must be in 0\.\.3, got 4"):
        patch(model, clean, corrupted, ("head", 0, 4), metric)
    with pytest.raises(ValueError, match=r"\(kind, layer, head\[, positions\]\)"):
        patch(model, clean, corrupted, ("head", 0), metric)
    with pytest.raises(ValueError, match="positions must be in"):
        patch(model, clean, corrupted, ("resid_pre", 0, [10]), metric)
    with pytest.raises(ValueError, match="no MLP"):
        patch(model, clean, corrupted, ("mlp_out", 0), metric)
    with pytest.raises(TypeError, match="site"):
        patch(model, clean, corrupted, "resid_pre", metric)
    with pytest.raises(ValueError, match="scalar"):
        patch(model, clean, corrupted, ("resid_pre", 0), lambda logits: logits[:, -1, 0])
    with pytest.raises(ValueError, match="nothing to recover"):
        patch(model, clean, clean, ("resid_pre", 0), metric)
    with pytest.raises(ValueError, match="receiver_input"):
        path_patch(model, clean, corrupted, (0, 0), (1, 0), "x", metric)
    with pytest.raises(TypeError, match=r"sender must be a \(layer, head\)"):
        path_patch(model, clean, corrupted, 0, (1, 0), "v", metric)
    with pytest.raises(TypeError, match="AttentionOnlyLM or a DecoderOnlyLM"):
        run_with_cache(torch.nn.Linear(2, 2), clean)
    with pytest.raises(ValueError, match="tokens must be a"):
        run_with_cache(model, clean.float())
    _, cache = run_with_cache(model, clean)
    with pytest.raises(ValueError, match="answer"):
        direct_logit_attribution(cache, model, VOCAB, 5)
    with pytest.raises(ValueError, match=r"wrong must be an int or a \(batch=3,\)"):
        direct_logit_attribution(cache, model, 1, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="position must be in"):
        direct_logit_attribution(cache, model, 1, 2, position=10)
    with pytest.raises(ValueError, match="was not made by this model"):
        direct_logit_attribution(cache, AttentionOnlyLM(VOCAB, d_model=16, num_heads=4, num_layers=1), 1, 2)
    with pytest.raises(ValueError, match=r"layer must be in 0\.\.1"):
        copying_score(model, 2, 0)


# ---------------------------------------------------------------------------------------------------------
# The OV circuit
# ---------------------------------------------------------------------------------------------------------
def test_a_head_whose_ov_circuit_is_the_identity_scores_one_and_its_negation_minus_one():
    """Vocabulary = stream = 8; head 0 reads dims 0-3 and writes them back, head 1 reads dims 4-7 and writes
    their negation. The embedding is an invertible random matrix and the unembedding its inverse, so the full
    OV circuit is similar to W_V W_O whatever the embedding."""
    torch.manual_seed(0)
    model = AttentionOnlyLM(8, d_model=8, num_heads=2, num_layers=1, max_len=4)
    attention = model.blocks[0].self_attention
    embed = torch.randn(8, 8) + 3 * torch.eye(8)
    with torch.no_grad():
        model.token_embedding.weight.copy_(embed)
        model.unembed.weight.copy_(torch.linalg.inv(embed).T)  # W_E W_Uᵀ = I
        attention.w_v.weight.copy_(torch.eye(8))  # head h's value reads dims 4h..4h+3
        attention.w_o.weight.copy_(torch.diag(torch.tensor([1.0] * 4 + [-1.0] * 4)))
    assert copying_score(model, 0, 0) == pytest.approx(1.0, abs=1e-9)
    assert copying_score(model, 0, 1) == pytest.approx(-1.0, abs=1e-9)
    with torch.no_grad():  # with the identity embedding, rows are e_i (head 0) or -e_i (head 1) on their dims
        model.token_embedding.weight.copy_(torch.eye(8))
        model.unembed.weight.copy_(torch.eye(8))
    assert copying_fraction(model, 0, 0) == pytest.approx(0.5)  # tokens 0-3 top their row; 4-7's rows are zero
    assert copying_fraction(model, 0, 1) == 0.0


def test_random_heads_score_near_zero():
    torch.manual_seed(0)
    model = AttentionOnlyLM(50, d_model=64, num_heads=4, num_layers=4, max_len=8)
    scores = torch.tensor([copying_score(model, layer, head) for layer in range(4) for head in range(4)])
    assert abs(float(scores.mean())) < 0.1 and float(scores.abs().max()) < 0.5


def test_copying_score_reads_the_value_head_of_its_group():
    """Four query heads share two value heads (h // 2). Heads 0 and 1 read dims 0-1 and write +/- them; heads 2
    and 3 read dims 2-3 and write +/- them. Read through value head h % 2 instead, heads 1 and 2 would map one
    pair of dims onto the other (a nilpotent circuit with no copying score)."""
    model = ac.DecoderOnlyLM(8, d_model=8, num_heads=4, num_layers=1, d_ff=8, max_len=4, positions="none",
                             tie_weights=False, config=ac.ModelConfig(num_kv_heads=2, norm="rmsnorm", bias=False))
    attention = model.blocks[0].self_attention
    eye = torch.eye(2)
    with torch.no_grad():
        model.token_embedding.weight.copy_(torch.eye(8))
        model.lm_head.weight.copy_(torch.eye(8))
        attention.w_v.weight.zero_()
        attention.w_v.weight[0:2, 0:2], attention.w_v.weight[2:4, 2:4] = eye, eye
        attention.w_o.weight.zero_()
        for head, (dims, sign) in enumerate([(0, 1), (0, -1), (2, 1), (2, -1)]):
            attention.w_o.weight[dims:dims + 2, 2 * head:2 * head + 2] = sign * eye
    assert [copying_score(model, 0, head) for head in range(4)] == pytest.approx([1, -1, 1, -1], abs=1e-9)
    assert [copying_fraction(model, 0, head) for head in range(4)] == pytest.approx([0.25, 0, 0.25, 0])


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_copying_score_and_fraction_follow_their_definition_through_the_norms(name):
    """M = W_E N1 W_V^h W_O^h Nf W_U with each norm's linear part N (LayerNorm: centring then gain; RMSNorm:
    gain): the eigenvalue balance of the full V x V matrix, and the share of rows whose diagonal is the maximum."""
    model = MODELS[name]()
    d = 16
    embed = model.token_embedding.weight.detach().double()
    unembed = model.lm_head.weight.detach().double()
    centre = torch.eye(d, dtype=torch.float64) - (1.0 / d if name == "gpt2" else 0.0)
    final = centre @ torch.diag(model.norm.weight.detach().double())
    for layer, block in enumerate(model.blocks):
        attention = block.self_attention
        first = centre @ torch.diag(block.norm1.weight.detach().double())
        d_head, group = attention.d_head, attention.num_heads // attention.num_kv_heads
        for head in range(attention.num_heads):
            kv = head // group
            w_v = attention.w_v.weight[kv * d_head:(kv + 1) * d_head].detach().double().T  # (d, d_head)
            w_o = attention.w_o.weight[:, head * d_head:(head + 1) * d_head].detach().double().T  # (d_head, d)
            full = embed @ first @ w_v @ w_o @ final @ unembed.T  # (V, V)
            eigenvalues = torch.linalg.eigvals(full)
            expected = float(eigenvalues.sum().real / eigenvalues.abs().sum())
            assert copying_score(model, layer, head) == pytest.approx(expected, abs=1e-6)
            own = full.diagonal()[:, None]
            expected = float(((full >= own).sum(dim=1) == 1).double().mean())
            assert copying_fraction(model, layer, head) == pytest.approx(expected)
            top3 = float(((full >= own).sum(dim=1) <= 3).double().mean())
            assert copying_fraction(model, layer, head, k=3) == pytest.approx(top3)


def test_prefix_matching_score_is_the_induction_score():
    assert prefix_matching_score is induction_score
