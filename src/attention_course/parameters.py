"""Counting parameters: of any module, and in closed form for the paper's Transformer (Vaswani et al. 2017).

Closed form for the encoder–decoder of :class:`~attention_course.Transformer` (biases on every linear layer,
2·d parameters per LayerNorm, sinusoidal positions without parameters), with d = d_model:

    encoder layer = (4d² + 4d) attention + (2·d·d_ff + d_ff + d) feed-forward + 2·2d LayerNorms
                  = 4d² + 2·d·d_ff + d_ff + 9d
    decoder layer = 2 attentions + feed-forward + 3 LayerNorms
                  = 8d² + 2·d·d_ff + d_ff + 15d
    embeddings    = vocab_size·d with one shared vocabulary and three-way tying (paper §3.4), no output bias

The number of heads does not appear: h heads of width d/h cost as much as one head of width d.
"""

from __future__ import annotations

from torch import nn

from attention_course.checks import check_int

__all__ = ["PAPER_CONFIGS", "count_parameters", "transformer_parameter_count"]

#: The two models of the paper's Table 3, with the sizes they report. "vocab_size" is the shared
#: byte-pair vocabulary of about 37000 tokens used for English-German (paper §5.1).
PAPER_CONFIGS: dict[str, dict[str, int | float]] = {
    "base": {
        "num_layers": 6,
        "d_model": 512,
        "d_ff": 2048,
        "num_heads": 8,
        "dropout": 0.1,
        "vocab_size": 37000,
        "reported_parameters": 65_000_000,
    },
    "big": {
        "num_layers": 6,
        "d_model": 1024,
        "d_ff": 4096,
        "num_heads": 16,
        "dropout": 0.3,
        "vocab_size": 37000,
        "reported_parameters": 213_000_000,
    },
}


def count_parameters(module: nn.Module, trainable_only: bool = False) -> int:
    """Number of scalar parameters in ``module``; a parameter shared by several layers counts once.

    Works on modules built on the ``meta`` device (shapes only, no memory).

    Args:
        module: any ``nn.Module``.
        trainable_only: count only parameters with ``requires_grad=True``.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(module).__name__}")
    # parameters() yields each Parameter object once, even if it is registered under several names.
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


def transformer_parameter_count(
    vocab_size: int,
    d_model: int,
    d_ff: int,
    num_layers: int,
    num_decoder_layers: int | None = None,
    tgt_vocab_size: int | None = None,
    tie_embeddings: bool = True,
    final_norms: bool = False,
) -> int:
    """Parameters of the encoder–decoder Transformer, in closed form (see the module docstring).

    Args:
        vocab_size: source vocabulary (the shared vocabulary when tied).
        d_model: model width d.
        d_ff: feed-forward hidden width.
        num_layers: encoder layers N (and decoder layers unless ``num_decoder_layers`` is given).
        num_decoder_layers: decoder layers, if different from ``num_layers``.
        tgt_vocab_size: target vocabulary, if different from ``vocab_size`` (needs ``tie_embeddings=False``).
        tie_embeddings: one matrix for source embedding, target embedding and output projection (no output
            bias); otherwise three matrices and an output bias.
        final_norms: count a final LayerNorm after each stack (pre-norm stacks, and ``nn.Transformer``,
            which always has them; the library's post-norm model has none by default).

    Example: the paper's base model with a shared 37000 vocabulary, as ``nn.Transformer`` builds it, has
    ``transformer_parameter_count(37000, 512, 2048, 6, final_norms=True) == 63_084_544`` parameters.
    """
    for name, value in (("vocab_size", vocab_size), ("d_model", d_model), ("d_ff", d_ff),
                        ("num_layers", num_layers)):
        check_int(name, value)
    num_decoder_layers = num_layers if num_decoder_layers is None else num_decoder_layers
    tgt_vocab_size = vocab_size if tgt_vocab_size is None else tgt_vocab_size
    if tie_embeddings and tgt_vocab_size != vocab_size:
        raise ValueError(
            f"tie_embeddings=True needs one shared vocabulary, got vocab_size={vocab_size} and "
            f"tgt_vocab_size={tgt_vocab_size}"
        )
    d = d_model
    attention = 4 * d * d + 4 * d  # W_Q, W_K, W_V, W_O and their biases
    feed_forward = 2 * d * d_ff + d_ff + d
    layer_norm = 2 * d
    encoder_layer = attention + feed_forward + 2 * layer_norm
    decoder_layer = 2 * attention + feed_forward + 3 * layer_norm
    body = num_layers * encoder_layer + num_decoder_layers * decoder_layer
    if final_norms:
        body += 2 * layer_norm
    if tie_embeddings:
        embeddings = vocab_size * d
    else:  # source embedding, target embedding, output projection with bias
        embeddings = vocab_size * d + 2 * tgt_vocab_size * d + tgt_vocab_size
    return body + embeddings
