"""The position-wise feed-forward network (Vaswani et al. 2017, §3.3) and its gated variant SwiGLU.

    FFN(x) = max(0, x W_1 + b_1) W_2 + b_2          d_model -> d_ff -> d_model

The same two linear layers are applied to every position separately; that makes the block a 1-D convolution
with kernel size 1 over the sequence. GPT-2 replaces the ReLU by GELU (Hendrycks and Gimpel 2016) in its tanh
approximation; Llama replaces the whole network by SwiGLU (Shazeer 2020), a gated linear unit whose gate goes
through SiLU (``x·σ(x)``):

    SwiGLU(x) = (SiLU(x W_gate) ⊙ x W_up) W_down    d_model -> d_ff (twice) -> d_model
"""

from __future__ import annotations

from torch import Tensor, nn
from torch.nn import functional as F

from attention_course.checks import check_int
from attention_course.config import ModelConfig
from attention_course.normalization import Dropout

__all__ = ["PositionwiseFeedForward", "SwiGLU", "feed_forward_for"]

_ACTIVATIONS = ("relu", "gelu", "gelu_tanh")


def _check_sizes(d_model: object, d_ff: object) -> None:
    for name, value in (("d_model", d_model), ("d_ff", d_ff)):
        check_int(name, value)


class PositionwiseFeedForward(nn.Module):
    """``linear1 -> activation -> dropout -> linear2``, the order used inside ``nn.TransformerEncoderLayer``.

    The dropout here acts on the hidden activations; the dropout on the block's output belongs to the
    residual connection around it (see :class:`~attention_course.EncoderLayer`).

    Args:
        d_model: input and output width.
        d_ff: hidden width (2048 for the paper's base model, 4 * d_model).
        dropout: dropout probability on the hidden activations.
        activation: ``"relu"`` (the paper), ``"gelu"`` (exact GELU, ``x·Φ(x)``) or ``"gelu_tanh"`` (GELU's
            tanh approximation, ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))``, which GPT-2 uses).
        bias: whether the two linear layers have biases.

    Shape: ``(..., d_model) -> (..., d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu",
                 bias: bool = True) -> None:
        super().__init__()
        _check_sizes(d_model, d_ff)
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {activation!r}")
        self.d_ff = d_ff
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        if activation == "relu":
            self.activation: nn.Module = nn.ReLU()
        else:
            self.activation = nn.GELU(approximate="tanh" if activation == "gelu_tanh" else "none")
        self.dropout = Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)

    @property
    def output_projection(self) -> nn.Linear:
        """The layer that writes into the residual stream (``linear2``)."""
        return self.linear2

    def forward(self, x: Tensor) -> Tensor:
        """``x (..., d_model)`` -> ``(..., d_model)``, each position independently."""
        hidden = self.dropout(self.activation(self.linear1(x)))  # (..., d_ff)
        return self.linear2(hidden)  # (..., d_model)


class SwiGLU(nn.Module):
    """The SwiGLU feed-forward network (Shazeer 2020), as in Llama: ``down(SiLU(gate(x)) ⊙ up(x))``.

    The gate decides, feature by feature, how much of ``up(x)`` passes. With three matrices instead of two,
    Llama takes ``d_ff`` about ``8/3 · d_model`` (rather than 4) to keep the parameter count of the ReLU
    network.

    Args:
        d_model: input and output width.
        d_ff: hidden width.
        dropout: dropout probability on the gated hidden activations.
        bias: whether the three linear layers have biases (Llama: no).

    Attributes:
        gate: ``nn.Linear(d_model, d_ff)`` (Llama's ``gate_proj``).
        up: ``nn.Linear(d_model, d_ff)`` (Llama's ``up_proj``).
        down: ``nn.Linear(d_ff, d_model)`` (``down_proj``).

    Shape: ``(..., d_model) -> (..., d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, bias: bool = False) -> None:
        super().__init__()
        _check_sizes(d_model, d_ff)
        self.d_ff = d_ff
        self.gate = nn.Linear(d_model, d_ff, bias=bias)
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.dropout = Dropout(dropout)
        self.down = nn.Linear(d_ff, d_model, bias=bias)

    @property
    def output_projection(self) -> nn.Linear:
        """The layer that writes into the residual stream (``down``)."""
        return self.down

    def forward(self, x: Tensor) -> Tensor:
        """``x (..., d_model)`` -> ``(..., d_model)``, each position independently."""
        hidden = F.silu(self.gate(x)) * self.up(x)  # (..., d_ff)
        return self.down(self.dropout(hidden))  # (..., d_model)


def feed_forward_for(d_model: int, d_ff: int, dropout: float = 0.0,
                     config: ModelConfig | None = None) -> PositionwiseFeedForward | SwiGLU:
    """The feed-forward network a :class:`~attention_course.ModelConfig` asks for (default: the paper's)."""
    config = ModelConfig() if config is None else config
    if config.feed_forward == "swiglu":
        return SwiGLU(d_model, d_ff, dropout=dropout, bias=config.bias)
    return PositionwiseFeedForward(d_model, d_ff, dropout=dropout, activation=config.feed_forward,
                                   bias=config.bias)
