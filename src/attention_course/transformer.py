"""The encoder and decoder stacks and the full encoder–decoder Transformer (Vaswani et al. 2017, §3).

Masks (True = may attend), for a source batch ``src (B, Ls)`` and a target batch ``tgt (B, Lt)``:

- ``src_mask``: the source padding mask ``padding_mask(src, pad_id)`` of shape ``(B, 1, 1, Ls)``.
- ``tgt_mask``: causal and target padding, ``combine_masks(padding_mask(tgt, pad_id), causal_mask(Lt))`` of
  shape ``(B, 1, Lt, Lt)``; a plain ``causal_mask(Lt)`` ``(Lt, Lt)`` when there is no padding.
- ``memory_mask``: what each target position may see of the source, usually the source padding mask again
  ``(B, 1, 1, Ls)``. It is not derived from ``src_mask`` automatically: pass it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attention_course.checks import check_int
from attention_course.config import ModelConfig
from attention_course.layers import DecoderLayer, EncoderLayer
from attention_course.normalization import LayerNorm, norm_for
from attention_course.positional import PositionalEncoding

__all__ = ["Decoder", "Encoder", "Transformer"]


def _layer_config(layer: EncoderLayer | DecoderLayer) -> dict:
    """The constructor arguments (except num_layers) of a stack made of copies of ``layer``."""
    attention = layer.self_attention
    return dict(d_model=attention.d_model, num_heads=attention.num_heads,
                d_ff=layer.feed_forward.linear1.out_features, dropout=layer.dropout1.p,
                norm_first=layer.norm_first)


def _copy_final_norm(target: LayerNorm | None, source: nn.LayerNorm | None, like: Tensor) -> None:
    if target is None:
        return
    target.to(device=like.device, dtype=like.dtype)
    with torch.no_grad():
        target.weight.copy_(source.weight)
        target.bias.copy_(source.bias)
    target.eps = source.eps


class Encoder(nn.Module):
    """``num_layers`` encoder layers applied in turn, optionally followed by a final LayerNorm.

    Args:
        num_layers, d_model, num_heads, d_ff, dropout, norm_first: see :class:`EncoderLayer`.
        final_norm: add a LayerNorm after the last layer. Default (None): only for pre-norm stacks, whose
            residual stream is otherwise never normalised. ``nn.TransformerEncoder`` inside ``nn.Transformer``
            always has one; pass True to match it.
        config: a :class:`~attention_course.ModelConfig` passed to every layer (and used for the final
            normalisation); default: the paper's choices.

    Shape: ``forward(x (B, L, d_model), mask) -> (B, L, d_model)``; ``mask`` broadcastable to ``(B, H, L, L)``.
    """

    def __init__(
        self,
        num_layers: int,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        norm_first: bool = False,
        final_norm: bool | None = None,
        config: ModelConfig | None = None,
    ) -> None:
        super().__init__()
        check_int("num_layers", num_layers)
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first, config=config) for _ in range(num_layers)
        )
        use_final_norm = norm_first if final_norm is None else final_norm
        self.norm = norm_for(d_model, config) if use_final_norm else None

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x) if self.norm is not None else x

    @classmethod
    def from_torch(cls, module: nn.TransformerEncoder) -> Encoder:
        """An :class:`Encoder` equal to ``module`` (e.g. ``nn.Transformer(...).encoder``), weights copied."""
        if not isinstance(module, nn.TransformerEncoder):
            raise TypeError(f"expected an nn.TransformerEncoder, got {type(module).__name__}")
        layers = [EncoderLayer.from_torch(layer) for layer in module.layers]
        new = cls(len(layers), **_layer_config(layers[0]), final_norm=module.norm is not None)
        new.layers = nn.ModuleList(layers)
        _copy_final_norm(new.norm, module.norm, like=layers[0].norm1.weight)
        new.train(module.training)
        return new


class Decoder(nn.Module):
    """``num_layers`` decoder layers applied in turn, optionally followed by a final LayerNorm.

    Arguments as for :class:`Encoder`.

    Shape: ``forward(x (B, Lt, d_model), memory (B, Ls, d_model), self_mask, memory_mask) -> (B, Lt, d_model)``
    with ``self_mask`` broadcastable to ``(B, H, Lt, Lt)`` and ``memory_mask`` to ``(B, H, Lt, Ls)``.
    """

    def __init__(
        self,
        num_layers: int,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        norm_first: bool = False,
        final_norm: bool | None = None,
        config: ModelConfig | None = None,
    ) -> None:
        super().__init__()
        check_int("num_layers", num_layers)
        self.layers = nn.ModuleList(
            DecoderLayer(d_model, num_heads, d_ff, dropout, norm_first, config=config) for _ in range(num_layers)
        )
        use_final_norm = norm_first if final_norm is None else final_norm
        self.norm = norm_for(d_model, config) if use_final_norm else None

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
    ) -> Tensor:
        for layer in self.layers:
            x = layer(x, memory, self_mask, memory_mask)
        return self.norm(x) if self.norm is not None else x

    @classmethod
    def from_torch(cls, module: nn.TransformerDecoder) -> Decoder:
        """A :class:`Decoder` equal to ``module`` (e.g. ``nn.Transformer(...).decoder``), weights copied."""
        if not isinstance(module, nn.TransformerDecoder):
            raise TypeError(f"expected an nn.TransformerDecoder, got {type(module).__name__}")
        layers = [DecoderLayer.from_torch(layer) for layer in module.layers]
        new = cls(len(layers), **_layer_config(layers[0]), final_norm=module.norm is not None)
        new.layers = nn.ModuleList(layers)
        _copy_final_norm(new.norm, module.norm, like=layers[0].norm1.weight)
        new.train(module.training)
        return new


class Transformer(nn.Module):
    """The encoder–decoder Transformer: embeddings, positions, encoder, decoder and output projection.

    Args:
        src_vocab_size, tgt_vocab_size: vocabulary sizes.
        d_model, num_heads, num_encoder_layers, num_decoder_layers, d_ff, dropout, norm_first: the model's
            shape (defaults: the paper's base model).
        tie_embeddings: share one ``(vocab, d_model)`` matrix between the source embedding, the target
            embedding and the output projection (paper §3.4); needs one shared vocabulary
            (``src_vocab_size == tgt_vocab_size``). The output projection then has no bias.
        max_len: longest source or target sequence (size of the positional table).
        final_norm: final LayerNorm on both stacks; default: only for pre-norm (see :class:`Encoder`).
        config: a :class:`~attention_course.ModelConfig` for both stacks' layers (attention options,
            normalisation, feed-forward); default: the paper's choices.

    Attributes:
        src_embedding: ``nn.Embedding`` of the source tokens.
        tgt_embedding: ``nn.Embedding`` of the target tokens; the same module as ``src_embedding`` when tied.
        positional_encoding: :class:`PositionalEncoding` with dropout, used for source and target.
        encoder: the :class:`Encoder`.
        decoder: the :class:`Decoder`.
        generator: ``nn.Linear(d_model, tgt_vocab_size)``, decoder states -> logits.

    Token embeddings are multiplied by √d_model before positions are added. They are initialised with
    standard deviation 1/√d_model, so the scaled embeddings have unit variance, the same order as the
    positional table (whose entries have mean square 1/2), and, when tied, the output projection starts
    with logits of a sensible size.

    The pieces can be called one by one (as decoding does): ``memory = model.encode(src, src_mask)`` once,
    then ``model.decode(tgt, memory, tgt_mask, memory_mask)`` for each new prefix.
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        d_model: int = 512,
        num_heads: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        d_ff: int = 2048,
        dropout: float = 0.1,
        norm_first: bool = False,
        tie_embeddings: bool = False,
        max_len: int = 512,
        final_norm: bool | None = None,
        config: ModelConfig | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("src_vocab_size", src_vocab_size), ("tgt_vocab_size", tgt_vocab_size),
                            ("num_encoder_layers", num_encoder_layers), ("num_decoder_layers", num_decoder_layers)):
            check_int(name, value)
        if tie_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError(
                "tie_embeddings=True needs one shared vocabulary, got src_vocab_size="
                f"{src_vocab_size} and tgt_vocab_size={tgt_vocab_size}"
            )
        self.d_model = d_model
        self.tie_embeddings = tie_embeddings
        self.src_embedding = nn.Embedding(src_vocab_size, d_model)
        self.tgt_embedding = self.src_embedding if tie_embeddings else nn.Embedding(tgt_vocab_size, d_model)
        self.positional_encoding = PositionalEncoding(d_model, max_len=max_len, dropout=dropout)
        stack = dict(d_model=d_model, num_heads=num_heads, d_ff=d_ff, dropout=dropout, norm_first=norm_first,
                     final_norm=final_norm, config=config)
        self.encoder = Encoder(num_encoder_layers, **stack)
        self.decoder = Decoder(num_decoder_layers, **stack)
        self.generator = nn.Linear(d_model, tgt_vocab_size, bias=not tie_embeddings)
        nn.init.normal_(self.src_embedding.weight, std=d_model**-0.5)
        if not tie_embeddings:
            nn.init.normal_(self.tgt_embedding.weight, std=d_model**-0.5)
        if tie_embeddings:
            self.generator.weight = self.src_embedding.weight  # one Parameter, three uses

    def _embed(self, embedding: nn.Embedding, tokens: Tensor, offset: int) -> Tensor:
        if tokens.dim() != 2:
            raise ValueError(f"token ids must have shape (batch, length), got {tuple(tokens.shape)}")
        x = embedding(tokens) * math.sqrt(self.d_model)  # (B, L, d_model)
        return self.positional_encoding(x, offset=offset)

    def embed_source(self, src: Tensor) -> Tensor:
        """``src (B, Ls)`` token ids -> ``(B, Ls, d_model)``: scaled embeddings plus positions, dropout."""
        return self._embed(self.src_embedding, src, 0)

    def embed_target(self, tgt: Tensor, offset: int = 0) -> Tensor:
        """``tgt (B, Lt)`` -> ``(B, Lt, d_model)``; ``offset`` is the position of ``tgt[:, 0]``."""
        return self._embed(self.tgt_embedding, tgt, offset)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """``src (B, Ls)`` -> memory ``(B, Ls, d_model)``; ``src_mask`` e.g. ``(B, 1, 1, Ls)``."""
        return self.encoder(self.embed_source(src), src_mask)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
    ) -> Tensor:
        """``tgt (B, Lt)`` and memory ``(B, Ls, d_model)`` -> logits ``(B, Lt, tgt_vocab_size)``.

        Position ``t`` of the logits predicts token ``t + 1``; ``tgt_mask`` must be causal (``(Lt, Lt)`` or
        ``(B, 1, Lt, Lt)``), ``memory_mask`` is usually the source padding mask ``(B, 1, 1, Ls)``.
        """
        hidden = self.decoder(self.embed_target(tgt), memory, tgt_mask, memory_mask)  # (B, Lt, d_model)
        return self.generator(hidden)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
    ) -> Tensor:
        """``src (B, Ls)``, ``tgt (B, Lt)`` -> logits ``(B, Lt, tgt_vocab_size)`` (teacher forcing)."""
        memory = self.encode(src, src_mask)
        return self.decode(tgt, memory, tgt_mask, memory_mask)
