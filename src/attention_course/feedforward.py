"""The position-wise feed-forward network (Vaswani et al. 2017, §3.3).

    FFN(x) = max(0, x W_1 + b_1) W_2 + b_2          d_model -> d_ff -> d_model

The same two linear layers are applied to every position separately; that makes the block a 1-D convolution
with kernel size 1 over the sequence.
"""

from __future__ import annotations

from torch import Tensor, nn

from attention_course.normalization import Dropout

__all__ = ["PositionwiseFeedForward"]


class PositionwiseFeedForward(nn.Module):
    """``linear1 -> ReLU -> dropout -> linear2``, the order used inside ``nn.TransformerEncoderLayer``.

    The dropout here acts on the hidden activations; the dropout on the block's output belongs to the
    residual connection around it (see :class:`~attention_course.EncoderLayer`).

    Args:
        d_model: input and output width.
        d_ff: hidden width (2048 for the paper's base model, 4 * d_model).
        dropout: dropout probability on the hidden activations.

    Shape: ``(..., d_model) -> (..., d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        for name, value in (("d_model", d_model), ("d_ff", d_ff)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.linear1 = nn.Linear(d_model, d_ff)
        self.activation = nn.ReLU()
        self.dropout = Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        """``x (..., d_model)`` -> ``(..., d_model)``, each position independently."""
        hidden = self.dropout(self.activation(self.linear1(x)))  # (..., d_ff)
        return self.linear2(hidden)  # (..., d_model)
