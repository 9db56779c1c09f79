"""An encoder-only sequence classifier built from the library's parts (chapter 09).

    token ids (B, L) -> embedding * √d_model + positions -> Encoder (padding masked) -> pool over tokens
                     -> Linear -> logits (B, num_classes)

Every module is built once, in ``__init__``, and the forward pass only calls them: creating layers inside
``forward`` (as a popular lecture's classifier does) gives fresh random weights on every call that the
optimiser never sees. The logits are trained with cross-entropy over ``num_classes`` outputs (two for
positive/negative), not with binary cross-entropy, which expects a single logit.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attention_course.checks import check_int
from attention_course.masks import padding_mask
from attention_course.positional import PositionalEncoding
from attention_course.transformer import Encoder

__all__ = ["POOLINGS", "EncoderClassifier", "pool_tokens"]

#: The ways to turn per-token states into one vector per sequence.
POOLINGS = ("mean", "max", "first")


def pool_tokens(states: Tensor, keep: Tensor, how: str = "mean") -> Tensor:
    """Pool ``states (B, L, d)`` over the tokens where ``keep (B, L)`` is True, giving ``(B, d)``.

    Args:
        states: per-token vectors.
        keep: bool, True for real tokens, False for padding (padding never enters the pool).
        how: ``"mean"`` (average of the real tokens), ``"max"`` (feature-wise maximum over the real tokens)
            or ``"first"`` (the first token's state, e.g. a ``<cls>`` token).

    Raises:
        ValueError: unknown ``how``, mismatched shapes, or a sequence with no real token.
        TypeError: ``keep`` is not boolean.
    """
    if how not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {how!r}")
    if states.dim() != 3 or keep.shape != states.shape[:2]:
        raise ValueError(
            f"expected states (B, L, d) and keep (B, L), got {tuple(states.shape)} and {tuple(keep.shape)}"
        )
    if keep.dtype != torch.bool:
        raise TypeError(f"keep must be a bool tensor (True = real token), got {keep.dtype}")
    counts = keep.sum(dim=1, keepdim=True)  # (B, 1)
    if bool((counts == 0).any()):
        raise ValueError("a sequence has no real token to pool over")
    if how == "first":
        return states[:, 0]
    mask = keep.unsqueeze(-1)  # (B, L, 1)
    if how == "mean":
        return (states * mask).sum(dim=1) / counts.to(states.dtype)
    lowest = torch.finfo(states.dtype).min  # padding can never be the maximum
    return states.masked_fill(~mask, lowest).amax(dim=1)


class EncoderClassifier(nn.Module):
    """Embeddings, sinusoidal positions, a Transformer encoder, pooling and a linear head.

    Args:
        vocab_size: number of token ids.
        num_classes: number of output logits (2 for binary sentiment).
        d_model, num_heads, num_layers, d_ff, dropout, norm_first: the encoder's shape
            (see :class:`~attention_course.transformer.Encoder`).
        pad_id: the padding id; padded keys are masked in attention and padded tokens are left out of the pool.
        pooling: ``"mean"``, ``"max"`` or ``"first"`` (see :func:`pool_tokens`).
        max_len: longest sequence supported by the positional table.

    Shape: ``forward(tokens (B, L)) -> logits (B, num_classes)``.
    """

    def __init__(
        self,
        vocab_size: int,
        num_classes: int = 2,
        d_model: int = 64,
        num_heads: int = 4,
        num_layers: int = 2,
        d_ff: int = 128,
        dropout: float = 0.1,
        norm_first: bool = False,
        pad_id: int = 0,
        pooling: str = "mean",
        max_len: int = 256,
    ) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("num_classes", num_classes)):
            check_int(name, value)
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        if not 0 <= pad_id < vocab_size:
            raise ValueError(f"pad_id={pad_id} is not a token id of a vocabulary of size {vocab_size}")
        self.d_model = d_model
        self.pad_id = pad_id
        self.pooling = pooling
        self.embedding = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)  # × √d_model below gives unit variance
        self.positional_encoding = PositionalEncoding(d_model, max_len=max_len, dropout=dropout)
        self.encoder = Encoder(num_layers, d_model, num_heads, d_ff, dropout=dropout, norm_first=norm_first)
        self.head = nn.Linear(d_model, num_classes)

    def encode(self, tokens: Tensor) -> Tensor:
        """``tokens (B, L)`` -> per-token states ``(B, L, d_model)`` (padded keys masked)."""
        if tokens.dim() != 2:
            raise ValueError(f"token ids must have shape (batch, length), got {tuple(tokens.shape)}")
        x = self.embedding(tokens) * math.sqrt(self.d_model)  # (B, L, d_model)
        x = self.positional_encoding(x)
        return self.encoder(x, padding_mask(tokens, self.pad_id))  # mask (B, 1, 1, L)

    def forward(self, tokens: Tensor) -> Tensor:
        """``tokens (B, L)`` -> logits ``(B, num_classes)``."""
        states = self.encode(tokens)  # (B, L, d_model)
        pooled = pool_tokens(states, tokens != self.pad_id, self.pooling)  # (B, d_model)
        return self.head(pooled)

    def attention_maps(self) -> list[Tensor]:
        """The self-attention weights of the last forward call, one ``(B, H, L, L)`` tensor per layer."""
        maps = [layer.self_attention_weights for layer in self.encoder.layers]
        if any(m is None for m in maps):
            raise ValueError("no attention weights yet: call the model on a batch first")
        return maps
