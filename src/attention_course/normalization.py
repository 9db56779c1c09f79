"""Layer normalisation (Ba, Kiros and Hinton 2016), RMS normalisation (Zhang and Sennrich 2019) and dropout
(Srivastava et al. 2014), written from scratch.

Each behaves like its PyTorch counterpart, ``nn.LayerNorm(d_model)``, ``nn.RMSNorm(d_model)`` and
``nn.Dropout(p)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attention_course.checks import check_int
from attention_course.config import ModelConfig

__all__ = ["Dropout", "LayerNorm", "RMSNorm", "norm_for"]


def _check_norm_arguments(d_model: int, eps: float) -> None:
    check_int("d_model", d_model)
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps!r}")


def _check_last_dimension(x: Tensor, d_model: int) -> None:
    if x.dim() == 0 or x.size(-1) != d_model:
        raise ValueError(f"expected an input of shape (..., {d_model}), got {tuple(x.shape)}")


class LayerNorm(nn.Module):
    """Normalise each token's features to zero mean and unit variance, then scale and shift.

        y = (x - mean) / sqrt(var + eps) * weight + bias

    The mean and the *biased* variance (divide by d_model, not d_model - 1) are taken over the last
    dimension, separately for every token; ``eps`` sits inside the square root, as in ``nn.LayerNorm``.

    Args:
        d_model: size of the last dimension of the input.
        eps: added to the variance for numerical stability.
        bias: whether to learn the shift (``nn.LayerNorm(..., bias=False)`` when False).

    Attributes:
        weight: learnable gain ``(d_model,)``, initialised to ones.
        bias: learnable shift ``(d_model,)``, initialised to zeros, or None.

    Shape: ``(..., d_model) -> (..., d_model)``.
    """

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        _check_norm_arguments(d_model, eps)
        self.d_model = d_model
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        """``x (..., d_model)`` -> normalised ``(..., d_model)``."""
        _check_last_dimension(x, self.d_model)
        # Half-precision inputs (float16/bfloat16, e.g. under autocast) are normalised in float32, as
        # nn.LayerNorm does: in float16 a mean near 100 keeps only about 3 significant digits, and the
        # deviations x - mean that remain would be mostly rounding error.
        dtype = x.dtype
        if dtype in (torch.float16, torch.bfloat16):
            x = x.float()
        # Two means (of x, then of the squared deviations) rather than torch.var_mean: the same biased
        # variance, and on rows as short as a small model's up to twice as fast on a CPU (forward and backward).
        centered = x - x.mean(dim=-1, keepdim=True)  # (..., d_model)
        var = (centered * centered).mean(dim=-1, keepdim=True)  # (..., 1)
        x_hat = centered * torch.rsqrt(var + self.eps)
        y = x_hat * self.weight.to(x.dtype)
        return (y if self.bias is None else y + self.bias.to(x.dtype)).to(dtype)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}" + ("" if self.bias is not None else ", bias=False")


class RMSNorm(nn.Module):
    """Divide each token's features by their root mean square, then scale (Zhang and Sennrich 2019).

        y = x / sqrt(mean(x²) + eps) * weight

    LayerNorm without its two centring steps: no mean is subtracted and no bias added. Zhang and Sennrich
    argue that the re-scaling, not the re-centring, is what stabilises training, and drop the rest to save
    time; Llama and most models after it use it. Equal to ``nn.RMSNorm(d_model, eps=eps)``.

    Args:
        d_model: size of the last dimension of the input.
        eps: added to the mean square for numerical stability.

    Attributes:
        weight: learnable gain ``(d_model,)``, initialised to ones.

    Shape: ``(..., d_model) -> (..., d_model)``. Half-precision inputs are normalised in float32.
    """

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        _check_norm_arguments(d_model, eps)
        self.d_model = d_model
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        """``x (..., d_model)`` -> normalised ``(..., d_model)``."""
        _check_last_dimension(x, self.d_model)
        dtype = x.dtype
        if dtype in (torch.float16, torch.bfloat16):
            x = x.float()  # squares of half-precision numbers overflow (float16) or lose digits (bfloat16)
        mean_square = x.pow(2).mean(dim=-1, keepdim=True)  # (..., 1)
        return (x * torch.rsqrt(mean_square + self.eps) * self.weight.to(x.dtype)).to(dtype)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"


def norm_for(d_model: int, config: ModelConfig | None = None) -> LayerNorm | RMSNorm:
    """The normalisation a :class:`~attention_course.ModelConfig` asks for: ``LayerNorm`` (with a bias when
    ``config.bias``) or ``RMSNorm``, with ``config.norm_eps``. Default: ``LayerNorm(d_model)``."""
    config = ModelConfig() if config is None else config
    if config.norm == "rmsnorm":
        return RMSNorm(d_model, eps=config.norm_eps)
    return LayerNorm(d_model, eps=config.norm_eps, bias=config.bias)


class Dropout(nn.Module):
    """Inverted dropout: in training, zero each element with probability ``p`` and scale survivors by 1/(1-p).

    Scaling at training time keeps every element's expected value unchanged, so evaluation (``model.eval()``)
    is the identity with no rescaling. ``p`` is the probability of *dropping* (PyTorch's convention; the
    dropout paper's ``p`` is the probability of keeping).

    Args:
        p: drop probability in ``[0, 1]``; ``p = 1`` zeroes everything in training, as ``nn.Dropout(1.0)`` does.

    Shape: any, unchanged.
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability p must be a number in [0, 1], got {p!r}")
        self.p = float(p)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.p == 1.0:
            return x * 0.0  # keeps the graph (zero gradient) without dividing by 1 - p = 0
        keep = torch.empty_like(x).bernoulli_(1.0 - self.p)  # 1 with probability 1 - p, else 0
        return x * keep.div_(1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"
