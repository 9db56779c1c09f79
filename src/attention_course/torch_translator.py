"""PyTorch's reference translator: the library's Transformer rebuilt from ``nn.TransformerEncoder``/``Decoder``.

Chapter 10 and the capstone benchmark train it side by side with :class:`~attention_course.Transformer`
(same embeddings, positions, output layer and parameter count, same ``encode``/``decode`` interface), to check
the library's model against PyTorch's and to compare their speed. ``from attention_course.training import
TorchTranslator`` keeps working.
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from attention_course.positional import PositionalEncoding

__all__ = ["TorchTranslator"]


class TorchTranslator(nn.Module):
    """The library's :class:`~attention_course.Transformer` rebuilt from PyTorch's layers.

    Embeddings (scaled by √d_model), sinusoidal positions and the output projection are as in the library;
    the encoder and decoder are ``nn.TransformerEncoder`` and ``nn.TransformerDecoder`` (post-norm, ReLU, no
    final LayerNorm, so the architecture and the parameter count equal the library model's). ``encode`` and
    ``decode`` take the library's masks (True = may attend) and convert them to PyTorch's (True = blocked):

    - ``src_mask`` / ``memory_mask``: None or a padding mask ``(B, 1, 1, Ls)``;
    - ``tgt_mask``: None or a causal mask ``(Lt, Lt)``.
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
        max_len: int = 512,
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.src_embedding = nn.Embedding(src_vocab_size, d_model)
        self.tgt_embedding = nn.Embedding(tgt_vocab_size, d_model)
        nn.init.normal_(self.src_embedding.weight, std=d_model**-0.5)
        nn.init.normal_(self.tgt_embedding.weight, std=d_model**-0.5)
        self.positional_encoding = PositionalEncoding(d_model, max_len=max_len, dropout=dropout)
        layer = dict(d_model=d_model, nhead=num_heads, dim_feedforward=d_ff, dropout=dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(**layer), num_encoder_layers,
                                             enable_nested_tensor=False)
        self.decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(**layer), num_decoder_layers)
        self.generator = nn.Linear(d_model, tgt_vocab_size)

    @staticmethod
    def _key_padding(mask: Tensor | None, name: str) -> Tensor | None:
        if mask is None:
            return None
        if mask.dim() != 4 or mask.shape[1:3] != (1, 1):
            raise ValueError(f"{name} must be None or a padding mask of shape (B, 1, 1, Ls), got {tuple(mask.shape)}")
        return ~mask[:, 0, 0, :]  # (B, Ls), True = padding (blocked)

    def _embed(self, embedding: nn.Embedding, tokens: Tensor) -> Tensor:
        return self.positional_encoding(embedding(tokens) * math.sqrt(self.d_model))

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """``src (B, Ls)`` -> memory ``(B, Ls, d_model)``."""
        return self.encoder(self._embed(self.src_embedding, src),
                            src_key_padding_mask=self._key_padding(src_mask, "src_mask"))

    def decode(
        self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None, memory_mask: Tensor | None = None
    ) -> Tensor:
        """``tgt (B, Lt)``, memory ``(B, Ls, d_model)`` -> logits ``(B, Lt, tgt_vocab_size)``."""
        if tgt_mask is not None and (tgt_mask.dim() != 2 or tgt_mask.size(0) != tgt.size(1)):
            raise ValueError(f"tgt_mask must be None or a causal mask ({tgt.size(1)}, {tgt.size(1)}), got "
                             f"{tuple(tgt_mask.shape)}")
        hidden = self.decoder(
            self._embed(self.tgt_embedding, tgt), memory, tgt_mask=None if tgt_mask is None else ~tgt_mask,
            memory_key_padding_mask=self._key_padding(memory_mask, "memory_mask"),
        )
        return self.generator(hidden)

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None) -> Tensor:
        """``src (B, Ls)``, ``tgt (B, Lt)`` -> logits ``(B, Lt, tgt_vocab_size)`` (teacher forcing)."""
        return self.decode(tgt, self.encode(src, src_mask), tgt_mask, memory_mask)
