"""``ac.load_hf_checkpoint``: tiny random GPT-2 and Llama checkpoints, built offline with ``transformers`` and
saved as safetensors, give the course's model the same logits (to 1e-5 in float32) and the same greedy
tokens, with and without the KV cache; bad directories and unsupported architectures get clear errors."""

import json

import pytest
import torch

import attention_course as ac

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency (requirements.txt)")
pytest.importorskip("safetensors", reason="safetensors is a test dependency (requirements.txt)")


def _spread_weights(model, seed):
    """Replace the tiny default init (std 0.02, logits near zero) by weights that give logits of order 1, so
    that a wrong mapping cannot hide under the 1e-5 tolerance."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if "norm" in name or ".ln_" in name or "ln_f" in name:
                parameter.copy_(1.0 + 0.2 * noise if name.endswith("weight") else 0.2 * noise)
            else:
                parameter.copy_(noise * (0.15 if parameter.dim() > 1 else 0.1))
    return model.eval()


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    config = transformers.GPT2Config(vocab_size=101, n_positions=48, n_embd=32, n_layer=2, n_head=4,
                                     bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    reference = _spread_weights(transformers.GPT2LMHeadModel(config), seed=1)
    directory = tmp_path_factory.mktemp("gpt2")
    reference.save_pretrained(directory, safe_serialization=True)
    return reference, directory


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=48,
                                      rope_theta=500.0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    reference = _spread_weights(transformers.LlamaForCausalLM(config), seed=2)
    directory = tmp_path_factory.mktemp("llama")
    reference.save_pretrained(directory, safe_serialization=True)
    return reference, directory


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_logits_equal_transformers(which, request):
    reference, directory = request.getfixturevalue(which)
    model = ac.load_hf_checkpoint(directory)
    tokens = torch.randint(0, reference.config.vocab_size, (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference(tokens).logits
        ours = model(tokens)
    assert expected.std() > 0.5  # logits of order 1: the comparison below means something
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-5)


def test_checkpoint_choices_become_the_config(gpt2, llama):
    gpt2_model = ac.load_hf_checkpoint(gpt2[1])
    assert gpt2_model.tied and gpt2_model.positions == "learned"
    assert gpt2_model.config.feed_forward == "gelu_tanh" and gpt2_model.config.norm == "layernorm"
    llama_model = ac.load_hf_checkpoint(llama[1])
    config = llama_model.config
    assert not llama_model.tied and llama_model.positions == "none"
    assert (config.positions, config.rotary_pairing, config.rotary_base) == ("rotary", "half", 500.0)
    assert (config.num_kv_heads, config.norm, config.feed_forward, config.bias) == (2, "rmsnorm", "swiglu", False)


def test_llama_needs_the_rotate_half_pairing(llama):
    """A control: the same weights read with the interleaved pairing give different logits."""
    reference, directory = llama
    model = ac.load_hf_checkpoint(directory)
    tokens = torch.randint(0, 97, (1, 30), generator=torch.Generator().manual_seed(1))
    for block in model.blocks:
        block.self_attention.rotary_pairing = "interleaved"
    with torch.no_grad():
        assert (model(tokens) - reference(tokens).logits).abs().max() > 1e-2


@pytest.mark.parametrize("which", ["gpt2", "llama"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_generation_equals_transformers(which, use_cache, request):
    reference, directory = request.getfixturevalue(which)
    model = ac.load_hf_checkpoint(directory)
    prompt = torch.randint(1, reference.config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = reference.generate(prompt, max_new_tokens=12, do_sample=False, use_cache=use_cache,
                                      attention_mask=torch.ones_like(prompt), pad_token_id=0, eos_token_id=None,
                                      min_new_tokens=12)
    ours = model.generate(prompt, 12, temperature=0, use_cache=use_cache)
    assert ours.shape == expected.shape == (2, 17)
    assert torch.equal(ours, expected)
    assert len(set(ours[0, 5:].tolist())) > 1  # not a constant continuation that any model would match


def test_dtype_argument(gpt2):
    model = ac.load_hf_checkpoint(gpt2[1], dtype=torch.bfloat16)
    assert model.token_embedding.weight.dtype == torch.bfloat16


def test_missing_directory_config_or_weights(tmp_path, gpt2):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ac.load_hf_checkpoint(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="config.json"):
        ac.load_hf_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text((gpt2[1] / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="safetensors"):
        ac.load_hf_checkpoint(tmp_path)


def _copy_with_config(source, target, **changes):
    config = json.loads((source / "config.json").read_text())
    config.update(changes)
    target.mkdir()
    (target / "config.json").write_text(json.dumps(config))
    (target / "model.safetensors").write_bytes((source / "model.safetensors").read_bytes())
    return target


def test_unsupported_architectures_and_options(tmp_path, gpt2, llama):
    with pytest.raises(ValueError, match="model_type 'bert'.*gpt2.*llama"):
        ac.load_hf_checkpoint(_copy_with_config(gpt2[1], tmp_path / "bert", model_type="bert"))
    with pytest.raises(ValueError, match="activation_function"):
        ac.load_hf_checkpoint(_copy_with_config(gpt2[1], tmp_path / "act", activation_function="swish"))
    with pytest.raises(ValueError, match="rope_type"):
        ac.load_hf_checkpoint(_copy_with_config(llama[1], tmp_path / "rope",
                                                rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                 "rope_theta": 500.0}))
    with pytest.raises(ValueError, match="head_dim"):
        ac.load_hf_checkpoint(_copy_with_config(llama[1], tmp_path / "head", head_dim=16))


def test_missing_and_leftover_weights(tmp_path, llama):
    from safetensors.torch import load_file, save_file

    weights = load_file(str(llama[1] / "model.safetensors"))
    target = tmp_path / "partial"
    target.mkdir()
    (target / "config.json").write_text((llama[1] / "config.json").read_text())
    missing = {k: v for k, v in weights.items() if k != "model.norm.weight"}
    save_file(missing, str(target / "model.safetensors"))
    with pytest.raises(ValueError, match="lacks 1 weight.*model.norm.weight"):
        ac.load_hf_checkpoint(target)
    save_file({**weights, "model.layers.0.self_attn.q_norm.weight": torch.ones(8)}, str(target / "model.safetensors"))
    with pytest.raises(ValueError, match="no place for.*q_norm"):
        ac.load_hf_checkpoint(target)
