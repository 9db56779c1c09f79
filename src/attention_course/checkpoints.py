"""Real checkpoints: the course's decoder-only model loaded from Hugging Face GPT-2 and Llama weights.

A Hugging Face checkpoint directory holds ``config.json`` (the architecture and its sizes) and one or more
``*.safetensors`` files (named tensors). :func:`load_hf_checkpoint` reads both and builds a
:class:`~attention_course.DecoderOnlyLM` whose :class:`~attention_course.ModelConfig` states each choice the
architecture makes, then copies every tensor into the parameter that plays the same role::

    ===============  ==============================  ===============================================
    course model     GPT-2 (prefix transformer.)     Llama (prefix model.)
    ===============  ==============================  ===============================================
    token_embedding  wte                             embed_tokens
    position         wpe (learned positions)         none: rotary, rotate-half pairing, in attention
    blocks[i].norm1  h.i.ln_1 (LayerNorm)            layers.i.input_layernorm (RMSNorm)
    w_q, w_k, w_v    h.i.attn.c_attn, split in 3, ᵀ  layers.i.self_attn.{q,k,v}_proj
    w_o              h.i.attn.c_proj, ᵀ              layers.i.self_attn.o_proj
    blocks[i].norm2  h.i.ln_2                        layers.i.post_attention_layernorm
    feed_forward     h.i.mlp.c_fc, c_proj, ᵀ; GELU   mlp.gate_proj, up_proj, down_proj
    norm             ln_f                            norm
    lm_head          tied to wte                     lm_head (untied)
    ===============  ==============================  ===============================================

GPT-2 stores its linear layers as ``Conv1D`` modules whose weight is ``(in, out)``, the transpose of
``nn.Linear``'s ``(out, in)``: ``x @ W + b`` rather than ``x @ Wᵀ + b``; hence the ᵀ above. Its ``c_attn``
computes queries, keys and values in one ``(d, 3d)`` product, which is split column-wise.

Loading needs the ``safetensors`` package (``pip install safetensors``); nothing here needs ``transformers``,
which the tests use only to build tiny random checkpoints and check the logits against.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from attention_course.config import ModelConfig
from attention_course.language_model import DecoderOnlyLM

__all__ = ["SUPPORTED_ARCHITECTURES", "load_hf_checkpoint"]

SUPPORTED_ARCHITECTURES = ("gpt2", "llama")

# Buffers some versions of transformers save that hold no learned weight (GPT-2's causal-mask tables and
# Llama's rotary frequencies, which the course recomputes).
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


def load_hf_checkpoint(directory: str | Path, dtype: torch.dtype = torch.float32) -> DecoderOnlyLM:
    """Build the course's :class:`~attention_course.DecoderOnlyLM` from a Hugging Face checkpoint directory.

    Args:
        directory: a folder with ``config.json`` and the weights as ``*.safetensors`` (one file, or
            several shards), as written by ``save_pretrained(..., safe_serialization=True)`` or downloaded
            from the Hub. Supported ``model_type``: ``"gpt2"`` and ``"llama"``.
        dtype: the floating-point dtype of the returned model (float32 by default, whatever the file holds).

    Returns:
        The model in evaluation mode, its ``forward(tokens)`` giving the checkpoint's next-token logits and its
        ``generate(prompt_ids, n, temperature=0)`` its greedy continuation.

    Raises:
        FileNotFoundError: no directory, no ``config.json`` or no ``*.safetensors`` file in it.
        ValueError: an architecture or an option of it that the course's model does not implement (named),
            or weights missing from, or left over in, the files.
        ImportError: the ``safetensors`` package is not installed.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint directory {str(directory)!r} does not exist")
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{str(directory)!r} has no config.json (the architecture and its sizes)")
    hf_config = json.loads(config_path.read_text())
    weight_files = sorted(directory.glob("*.safetensors"))
    if not weight_files:
        raise FileNotFoundError(f"{str(directory)!r} has no *.safetensors weights (a checkpoint saved only as "
                                "pytorch_model.bin can be converted with save_pretrained(safe_serialization=True))")
    model_type = hf_config.get("model_type")
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"model_type {model_type!r} in {config_path} is not supported; load_hf_checkpoint reads "
                         f"{SUPPORTED_ARCHITECTURES}")
    weights = _read_safetensors(weight_files)
    if model_type == "gpt2":
        model, assignments = _gpt2(hf_config, weights)
    else:
        model, assignments = _llama(hf_config, weights)
    _assign(model, assignments, weights, directory)
    return model.to(dtype).eval()


def _read_safetensors(files: list[Path]) -> dict[str, Tensor]:
    try:
        from safetensors.torch import load_file
    except ImportError as error:  # an optional dependency: say how to get it
        raise ImportError("load_hf_checkpoint needs the safetensors package: pip install safetensors") from error
    weights: dict[str, Tensor] = {}
    for file in files:
        weights.update(load_file(str(file)))
    return weights


def _require(hf_config: dict, key: str, expected: object, meaning: str) -> None:
    value = hf_config.get(key, expected)
    if value != expected:
        raise ValueError(f"{hf_config.get('model_type')} checkpoints with {key}={value!r} are not supported "
                         f"(the course's model needs {key}={expected!r}: {meaning})")


class _Names(dict):
    """Checkpoint names looked up without the model's prefix (``transformer.``, ``model.``), which the Hub's
    original GPT-2 files omit and ``save_pretrained`` writes; a name not found keeps the file's convention."""

    def __init__(self, weights: dict[str, Tensor], prefix: str) -> None:
        super().__init__({name[len(prefix):] if name.startswith(prefix) else name: name for name in weights})
        self.prefix = prefix if any(name.startswith(prefix) for name in weights) else ""

    def get(self, short: str, default: object = None) -> str:  # type: ignore[override]
        return super().get(short, self.prefix + short)


# A list of (course parameter, checkpoint tensor name, how to transform it) triples.
_Assignment = tuple[nn.Parameter, str, object]


def _gpt2(hf_config: dict, weights: dict[str, Tensor]) -> tuple[DecoderOnlyLM, list[_Assignment]]:
    activations = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
    activation = hf_config.get("activation_function", "gelu_new")
    if activation not in activations:
        raise ValueError(f"GPT-2 activation_function={activation!r} is not supported; the course's model has "
                         f"{sorted(activations)}")
    _require(hf_config, "scale_attn_weights", True, "scores scaled by 1/√d_head")
    _require(hf_config, "scale_attn_by_inverse_layer_idx", False, "the same score scale in every layer")
    d_model, num_layers = hf_config["n_embd"], hf_config["n_layer"]
    d_ff = hf_config.get("n_inner") or 4 * d_model
    config = ModelConfig(feed_forward=activations[activation], norm_eps=hf_config.get("layer_norm_epsilon", 1e-5))
    tied = hf_config.get("tie_word_embeddings", True)
    model = DecoderOnlyLM(hf_config["vocab_size"], d_model=d_model, num_heads=hf_config["n_head"],
                          num_layers=num_layers, d_ff=d_ff, max_len=hf_config["n_positions"], positions="learned",
                          tie_weights=tied, config=config)
    name = _Names(weights, "transformer.")
    linear = lambda w: w.T  # Conv1D (in, out) -> nn.Linear (out, in)  # noqa: E731
    same = lambda w: w  # noqa: E731
    part = lambda i: (lambda w: w.chunk(3, dim=-1)[i].T if w.dim() == 2 else w.chunk(3)[i])  # noqa: E731
    out: list[_Assignment] = [(model.token_embedding.weight, name.get("wte.weight", "wte.weight"), same),
                              (model.position.embedding.weight, name.get("wpe.weight", "wpe.weight"), same),
                              (model.norm.weight, name.get("ln_f.weight", "ln_f.weight"), same),
                              (model.norm.bias, name.get("ln_f.bias", "ln_f.bias"), same)]
    if not tied or "lm_head.weight" in weights:  # a tied copy, when saved, is written into the same matrix
        out.append((model.lm_head.weight, "lm_head.weight", same))
    for i, block in enumerate(model.blocks):
        def key(suffix: str, i: int = i) -> str:
            short = f"h.{i}.{suffix}"
            return name.get(short, short)
        attention, ff = block.self_attention, block.feed_forward
        for index, projection in enumerate((attention.w_q, attention.w_k, attention.w_v)):
            out += [(projection.weight, key("attn.c_attn.weight"), part(index)),
                    (projection.bias, key("attn.c_attn.bias"), part(index))]
        out += [(attention.w_o.weight, key("attn.c_proj.weight"), linear),
                (attention.w_o.bias, key("attn.c_proj.bias"), same),
                (ff.linear1.weight, key("mlp.c_fc.weight"), linear), (ff.linear1.bias, key("mlp.c_fc.bias"), same),
                (ff.linear2.weight, key("mlp.c_proj.weight"), linear),
                (ff.linear2.bias, key("mlp.c_proj.bias"), same)]
        for norm, hf_norm in ((block.norm1, "ln_1"), (block.norm2, "ln_2")):
            out += [(norm.weight, key(f"{hf_norm}.weight"), same), (norm.bias, key(f"{hf_norm}.bias"), same)]
    return model, out


def _rope_theta(hf_config: dict) -> float:
    parameters = hf_config.get("rope_parameters") or {}
    scaling = hf_config.get("rope_scaling") or {}
    rope_type = parameters.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if rope_type != "default":
        raise ValueError(f"llama checkpoints with rope_type={rope_type!r} (scaled rotary positions) are not "
                         "supported: the course's rotary embedding has one base and no rescaling")
    return float(parameters.get("rope_theta", hf_config.get("rope_theta", 10000.0)))


def _llama(hf_config: dict, weights: dict[str, Tensor]) -> tuple[DecoderOnlyLM, list[_Assignment]]:
    _require(hf_config, "hidden_act", "silu", "the SwiGLU feed-forward gates with SiLU")
    d_model, num_heads = hf_config["hidden_size"], hf_config["num_attention_heads"]
    head_dim = hf_config.get("head_dim") or d_model // num_heads
    if head_dim * num_heads != d_model:
        raise ValueError(f"llama checkpoints with head_dim={head_dim} * num_attention_heads={num_heads} != "
                         f"hidden_size={d_model} are not supported (the course's heads split d_model)")
    attention_bias, mlp_bias = hf_config.get("attention_bias", False), hf_config.get("mlp_bias", False)
    if attention_bias != mlp_bias:
        raise ValueError(f"llama checkpoints with attention_bias={attention_bias} and mlp_bias={mlp_bias} are not "
                         "supported: the course's config has one bias switch for both")
    config = ModelConfig(positions="rotary", rotary_pairing="half", rotary_base=_rope_theta(hf_config),
                         num_kv_heads=hf_config.get("num_key_value_heads") or num_heads, norm="rmsnorm",
                         norm_eps=hf_config.get("rms_norm_eps", 1e-6), feed_forward="swiglu", bias=bool(mlp_bias))
    tied = hf_config.get("tie_word_embeddings", False)
    model = DecoderOnlyLM(hf_config["vocab_size"], d_model=d_model, num_heads=num_heads,
                          num_layers=hf_config["num_hidden_layers"], d_ff=hf_config["intermediate_size"],
                          max_len=hf_config["max_position_embeddings"], positions="none", tie_weights=tied,
                          config=config)
    name = _Names(weights, "model.")
    same = lambda w: w  # noqa: E731
    out: list[_Assignment] = [(model.token_embedding.weight, name.get("embed_tokens.weight", "embed_tokens.weight"),
                               same), (model.norm.weight, name.get("norm.weight", "norm.weight"), same)]
    if not tied or "lm_head.weight" in weights:
        out.append((model.lm_head.weight, "lm_head.weight", same))
    for i, block in enumerate(model.blocks):
        def key(suffix: str, i: int = i) -> str:
            short = f"layers.{i}.{suffix}"
            return name.get(short, short)
        attention, ff = block.self_attention, block.feed_forward
        pairs = [(attention.w_q, "self_attn.q_proj"), (attention.w_k, "self_attn.k_proj"),
                 (attention.w_v, "self_attn.v_proj"), (attention.w_o, "self_attn.o_proj"),
                 (ff.gate, "mlp.gate_proj"), (ff.up, "mlp.up_proj"), (ff.down, "mlp.down_proj")]
        for linear, hf_name in pairs:
            out.append((linear.weight, key(f"{hf_name}.weight"), same))
            if linear.bias is not None:
                out.append((linear.bias, key(f"{hf_name}.bias"), same))
        out += [(block.norm1.weight, key("input_layernorm.weight"), same),
                (block.norm2.weight, key("post_attention_layernorm.weight"), same)]
    return model, out


def _assign(model: DecoderOnlyLM, assignments: list[_Assignment], weights: dict[str, Tensor],
            directory: Path) -> None:
    """Copy every checkpoint tensor into its parameter, checking shapes; refuse missing or unused tensors."""
    missing = [name for _, name, _ in assignments if name not in weights]
    if missing:
        raise ValueError(f"the checkpoint in {str(directory)!r} lacks {len(missing)} weight(s) the model needs, "
                         f"e.g. {missing[:3]}")
    used = {name for _, name, _ in assignments}
    unused = [name for name in weights if name not in used and not name.endswith(_IGNORED_SUFFIXES)]
    if unused:
        raise ValueError(f"the checkpoint in {str(directory)!r} has {len(unused)} weight(s) the course's model has "
                         f"no place for, e.g. {unused[:3]}: a variant of the architecture it does not implement")
    with torch.no_grad():
        for parameter, name, transform in assignments:
            value = transform(weights[name])
            if value.shape != parameter.shape:
                raise ValueError(f"checkpoint weight {name!r} has shape {tuple(value.shape)} after conversion, "
                                 f"the model's parameter {tuple(parameter.shape)}")
            parameter.copy_(value.to(parameter.dtype))
