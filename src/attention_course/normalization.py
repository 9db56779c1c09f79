"""Layer normalisation (Ba, Kiros and Hinton 2016) and dropout (Srivastava et al. 2014), written from scratch.

Both behave like their PyTorch counterparts, ``nn.LayerNorm(d_model)`` and ``nn.Dropout(p)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["Dropout", "LayerNorm"]


class LayerNorm(nn.Module):
    """Normalise each token's features to zero mean and unit variance, then scale and shift.

        y = (x - mean) / sqrt(var + eps) * weight + bias

    The mean and the *biased* variance (divide by d_model, not d_model - 1) are taken over the last
    dimension, separately for every token; ``eps`` sits inside the square root, as in ``nn.LayerNorm``.

    Args:
        d_model: size of the last dimension of the input.
        eps: added to the variance for numerical stability.

    Attributes:
        weight: learnable gain ``(d_model,)``, initialised to ones.
        bias: learnable shift ``(d_model,)``, initialised to zeros.

    Shape: ``(..., d_model) -> (..., d_model)``.
    """

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model < 1:
            raise ValueError(f"d_model must be a positive int, got {d_model!r}")
        if not eps > 0:
            raise ValueError(f"eps must be positive, got {eps!r}")
        self.d_model = d_model
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: Tensor) -> Tensor:
        """``x (..., d_model)`` -> normalised ``(..., d_model)``."""
        if x.dim() == 0 or x.size(-1) != self.d_model:
            raise ValueError(f"expected an input of shape (..., {self.d_model}), got {tuple(x.shape)}")
        # Half-precision inputs (float16/bfloat16, e.g. under autocast) are normalised in float32, as
        # nn.LayerNorm does: in float16 a mean near 100 keeps only about 3 significant digits, and the
        # deviations x - mean that remain would be mostly rounding error.
        dtype = x.dtype
        if dtype in (torch.float16, torch.bfloat16):
            x = x.float()
        var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)  # (..., 1) each, biased variance
        x_hat = (x - mean) * torch.rsqrt(var + self.eps)
        return (x_hat * self.weight.to(x.dtype) + self.bias.to(x.dtype)).to(dtype)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"


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
