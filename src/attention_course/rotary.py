"""Rotary position embedding (RoPE, Su et al. 2021): positions enter attention as rotations of q and k.

Chapter 07 showed that the sinusoidal table is a set of clocks: moving ``k`` positions rotates every pair of
columns ``(2i, 2i+1)`` by the angle ``k·ω_i``, with ``ω_i = base^(-2i/d)``. RoPE applies that rotation to the
queries and keys themselves instead of adding a table to the input:

    x'[2i]   = x[2i] cos(p ω_i) - x[2i+1] sin(p ω_i)
    x'[2i+1] = x[2i] sin(p ω_i) + x[2i+1] cos(p ω_i)

Rotations are orthogonal, so ``(R_p q) · (R_s k) = q · R_(s-p) k``: the score of a query at position ``p`` and a
key at ``s`` depends on their contents and on the offset ``s - p`` only, never on ``p`` itself.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attention_course.checks import check_tensor

__all__ = ["ROTARY_PAIRINGS", "apply_rotary", "rotary_frequencies"]

ROTARY_PAIRINGS = ("interleaved", "half")


def rotary_frequencies(dim: int, base: float = 10000.0, device: torch.device | str | None = None) -> Tensor:
    """The ``dim / 2`` angular frequencies ``ω_i = base^(-2i/dim)``, fastest (ω_0 = 1) first, in float64."""
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2 != 0:
        raise ValueError(
            f"the feature size must be a positive even int (features are rotated in pairs), got {dim!r}"
        )
    if not isinstance(base, (int, float)) or isinstance(base, bool) or base <= 1.0:
        raise ValueError(f"base must be a number greater than 1, got {base!r}")
    two_i = torch.arange(0, dim, 2, dtype=torch.float64, device=device)  # 0, 2, 4, ...
    return base ** (-two_i / dim)  # (dim/2,)


def apply_rotary(
    x: Tensor, positions: Tensor | None = None, base: float = 10000.0, pairing: str = "interleaved"
) -> Tensor:
    """Rotate each pair of features ``(2i, 2i+1)`` of ``x`` by the angle ``position · base^(-2i/d)``.

    With ``pairing="half"`` the pairs are ``(i, i + d/2)`` instead: the "rotate-half" layout of GPT-NeoX and
    of Llama's Hugging Face checkpoints, ``x·cos + rotate_half(x)·sin`` with ``rotate_half(x) = [-x₂, x₁]``.
    Pair ``i`` turns at the same frequency ``ω_i`` in both layouts, so the two are one rotation applied to
    features in a different order: ``apply_rotary(x[..., perm], pairing="half") ==
    apply_rotary(x, pairing="interleaved")[..., perm]`` with ``perm = [0, 2, 4, ..., 1, 3, 5, ...]``.

    Args:
        x: ``(..., L, d)`` queries or keys (usually per head, ``(B, H, L, d_head)``); ``d`` must be even.
        positions: the position of each of the ``L`` rows: ``(L,)`` or broadcastable to ``x.shape[:-1]``
            (integers or floats). Default ``arange(L)``. A KV-cached decoding step passes the positions of
            its new tokens, e.g. ``arange(past, past + L)``.
        base: the frequency base (10000 in RoFormer and LLaMA, as in the sinusoidal table of chapter 07).
        pairing: ``"interleaved"`` (pairs ``(2i, 2i+1)``, RoFormer) or ``"half"`` (pairs ``(i, i + d/2)``).

    Returns:
        ``(..., L, d)``, same dtype as ``x``. The angles are computed in float64 so that large positions do
        not lose precision.

    Raises:
        TypeError: ``x`` is not a floating-point tensor.
        ValueError: ``d`` is odd, ``x`` has fewer than 2 dimensions, ``positions`` does not broadcast, or an
            unknown ``pairing``.
    """
    check_tensor("x", x, floating=True)
    if pairing not in ROTARY_PAIRINGS:
        raise ValueError(f"pairing must be one of {ROTARY_PAIRINGS}, got {pairing!r}")
    if x.dim() < 2:
        raise ValueError(f"x must have shape (..., length, features), got {tuple(x.shape)}")
    length, dim = x.size(-2), x.size(-1)
    if dim % 2 != 0:
        raise ValueError(f"apply_rotary needs an even feature size (features are rotated in pairs), got d={dim} "
                         f"in x of shape {tuple(x.shape)}")
    frequencies = rotary_frequencies(dim, base, device=x.device)  # (d/2,)
    if positions is None:
        positions = torch.arange(length, device=x.device)
    check_tensor("positions", positions)
    try:
        torch.broadcast_shapes(positions.shape, x.shape[:-1])
    except RuntimeError:
        raise ValueError(f"positions of shape {tuple(positions.shape)} do not broadcast to the rows of x, "
                         f"{tuple(x.shape[:-1])}") from None
    angles = positions.to(device=x.device, dtype=torch.float64).unsqueeze(-1) * frequencies  # (..., L, d/2)
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    if pairing == "half":  # pair i is (x[i], x[i + d/2]): rotate the two halves as blocks
        first, second = x[..., : dim // 2], x[..., dim // 2 :]  # (..., L, d/2) each
        return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)  # (..., L, d)
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., L, d/2) each: the two coordinates of every pair
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)  # (..., L, d/2, 2)
    return rotated.flatten(-2)  # (..., L, d): pairs interleaved again
