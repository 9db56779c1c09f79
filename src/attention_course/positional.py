"""Positional information for attention, which on its own treats its input as a set.

- :func:`sinusoidal_positional_encoding`: the fixed table of Vaswani et al. 2017, §3.5.
- :class:`PositionalEncoding`: adds that table to token embeddings, then applies dropout.
- :class:`LearnedPositionalEmbedding`: the learned alternative (one trained vector per position).

The Transformer multiplies its token embeddings by √d_model *before* adding positions (paper §3.4); that is
the caller's job (see :class:`~attention_course.Transformer`), not these modules'.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attention_course.checks import check_int
from attention_course.normalization import Dropout

__all__ = ["LearnedPositionalEmbedding", "PositionalEncoding", "sinusoidal_positional_encoding"]


def sinusoidal_positional_encoding(
    num_positions: int,
    d_model: int,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """The sinusoidal table ``PE`` of shape ``(num_positions, d_model)``, positions counted from 0.

        PE[p, 2i]     = sin(p / 10000^(2i / d_model))
        PE[p, 2i + 1] = cos(p / 10000^(2i / d_model))        for i = 0 .. d_model/2 - 1

    Each pair of columns is a clock running at its own frequency, from wavelength 2π (i = 0) to almost
    2π·10000; moving by k positions rotates every pair by a fixed angle, so ``PE[p + k]`` is a linear
    function of ``PE[p]`` and ``PE[p] · PE[q]`` depends only on ``q - p``.

    Args:
        num_positions: number of positions (rows).
        d_model: number of features (columns); must be even.
        dtype: dtype of the result (default: torch's default dtype). The table is computed in float64.
        device: device of the result.

    Raises:
        TypeError: an argument is not an int.
        ValueError: ``d_model`` is odd, or an argument is less than 1.
    """
    check_int("num_positions", num_positions)
    check_int("d_model", d_model)
    if d_model % 2 != 0:
        raise ValueError(f"d_model must be even (features come in sin/cos pairs), got d_model={d_model}")
    position = torch.arange(num_positions, dtype=torch.float64).unsqueeze(1)  # (P, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d_model/2,): 0, 2, 4, ...
    inverse_wavelength = torch.exp(-math.log(10000.0) * two_i / d_model)  # 1 / 10000^(2i/d)
    angle = position * inverse_wavelength  # (P, d_model/2)
    table = torch.empty(num_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)
    return table.to(dtype=dtype or torch.get_default_dtype(), device=device)


def _check_input(x: Tensor, d_model: int, max_len: int, offset: int) -> None:
    if x.dim() != 3 or x.size(-1) != d_model:
        raise ValueError(f"expected input of shape (batch, length, d_model={d_model}), got {tuple(x.shape)}")
    check_int("offset", offset, minimum=0)
    if offset + x.size(1) > max_len:
        raise ValueError(
            f"positions {offset}..{offset + x.size(1) - 1} exceed max_len={max_len}; "
            "build the module with a larger max_len"
        )


class PositionalEncoding(nn.Module):
    """Add the sinusoidal table to its input, then apply dropout (paper §5.4: dropout on the sums).

    The input is usually token embeddings already multiplied by √d_model by the caller, as the
    :class:`~attention_course.Transformer` does, so that they are not drowned by the table's unit-size entries.

    Args:
        d_model: feature size (even).
        max_len: longest sequence supported.
        dropout: dropout probability on the sum.

    Shape: ``forward(x (B, L, d_model), offset=0) -> (B, L, d_model)``; ``offset`` is the position of the first
    token, so a decoder generating one token at a time can pass the current step.
    """

    pe: Tensor

    def __init__(self, d_model: int, max_len: int = 512, dropout: float = 0.1) -> None:
        super().__init__()
        check_int("max_len", max_len)
        self.d_model = d_model
        self.max_len = max_len
        # A buffer, not a parameter: it moves with .to(device) but is not trained or saved.
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model), persistent=False)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        _check_input(x, self.d_model, self.max_len, offset)
        positions = self.pe[offset : offset + x.size(1)].to(x.dtype)  # (L, d_model), broadcast over batch
        return self.dropout(x + positions)


class LearnedPositionalEmbedding(nn.Module):
    """Add a learned vector per position (as in BERT and GPT-2), then apply dropout.

    Args:
        max_len: number of positions that have a vector; longer sequences are rejected.
        d_model: feature size.
        dropout: dropout probability on the sum.

    Shape: ``forward(x (B, L, d_model), offset=0) -> (B, L, d_model)``.
    """

    def __init__(self, max_len: int, d_model: int, dropout: float = 0.1) -> None:
        super().__init__()
        check_int("max_len", max_len)
        check_int("d_model", d_model)
        self.d_model = d_model
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)
        # std 0.02, GPT-2's initialiser range. Next to token embeddings of order 1 (nn.Embedding's default, or
        # the √d_model-scaled ones of the Transformer) these start about 50x smaller: at first the tokens drown
        # the positions, not the reverse, and training must grow the position vectors before order is visible.
        nn.init.normal_(self.embedding.weight, std=0.02)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        _check_input(x, self.d_model, self.max_len, offset)
        positions = self.embedding.weight[offset : offset + x.size(1)]  # (L, d_model)
        return self.dropout(x + positions)
