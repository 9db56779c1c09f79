"""Scaled dot-product attention, the core operation of the Transformer (Vaswani et al. 2017, eq. 1).

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V

Conventions used throughout the library:

- Row vectors: one token per row, so ``query`` is ``(..., Lq, d_k)`` and ``scores = query @ keyᵀ`` is
  ``(..., Lq, Lk)``: one row per query, one column per key.
- Boolean masks where **True means "may attend"** (as in ``torch.nn.functional.scaled_dot_product_attention``;
  note that ``torch.nn.MultiheadAttention`` uses the opposite convention, True = blocked).
- A query row with no allowed key gets zero weights and zero output, never NaN.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attention_course.checks import check_qkv

__all__ = ["check_bias", "check_mask", "masked_softmax", "scaled_dot_product_attention"]


def check_bias(bias: Tensor, scores_shape: torch.Size | tuple[int, ...]) -> None:
    """Raise unless ``bias`` is a floating-point tensor that broadcasts to ``scores_shape`` without enlarging it.

    Raises:
        TypeError: ``bias`` is not a floating-point tensor.
        ValueError: ``bias`` does not broadcast to ``scores_shape`` or would enlarge it.
    """
    if not isinstance(bias, Tensor) or not bias.is_floating_point():
        raise TypeError(f"bias must be a floating-point torch.Tensor, got {_describe(bias)}")
    scores_shape = torch.Size(scores_shape)
    try:
        broadcast = torch.broadcast_shapes(bias.shape, scores_shape)
    except RuntimeError:
        broadcast = None
    if broadcast != scores_shape:
        raise ValueError(f"bias of shape {tuple(bias.shape)} does not broadcast to the attention scores of "
                         f"shape {tuple(scores_shape)} (batch..., queries, keys); each bias dimension must "
                         "equal the scores' dimension or be 1")


def check_mask(mask: Tensor, scores_shape: torch.Size | tuple[int, ...]) -> None:
    """Raise if ``mask`` is not a boolean tensor that broadcasts to ``scores_shape`` without enlarging it.

    Args:
        mask: candidate mask, True = may attend.
        scores_shape: shape of the attention scores, ``(..., Lq, Lk)``.

    Raises:
        TypeError: ``mask`` is not a tensor, or not of dtype ``torch.bool``.
        ValueError: ``mask`` does not broadcast to ``scores_shape``, or broadcasting would enlarge the scores
            (a mask with more dimensions, or a size where the scores have 1).
    """
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor of dtype torch.bool, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask must have dtype torch.bool (True = may attend), got {mask.dtype}; "
            "convert with mask.bool() or build it with a comparison such as tokens != pad_id"
        )
    scores_shape = torch.Size(scores_shape)
    try:
        broadcast = torch.broadcast_shapes(mask.shape, scores_shape)
    except RuntimeError:
        broadcast = None
    if broadcast != scores_shape:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the attention scores of shape "
            f"{tuple(scores_shape)} (batch..., queries, keys); each mask dimension must equal the scores' "
            "dimension or be 1"
        )


def masked_softmax(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """Softmax over the last dimension of ``scores``, ignoring the keys where ``mask`` is False.

    Masked scores are replaced by the most negative finite number (not ``-inf``), so a row with every key
    masked gives a finite, uniform softmax instead of ``0 / 0 = NaN``; the weights of masked keys are then
    set to exactly zero, which zeroes such rows and keeps masked keys at zero weight whatever the range of
    the allowed scores. Values and gradients stay finite.

    Half precision: ``float16`` and ``bfloat16`` scores are converted to ``float32`` for the softmax (as
    PyTorch's own kernels accumulate it) and the weights are returned in the input dtype.

    Args:
        scores: ``(..., Lq, Lk)`` attention scores, floating point.
        mask: optional boolean tensor broadcastable to ``scores``, True = may attend.

    Returns:
        ``(..., Lq, Lk)`` weights in ``scores.dtype``: each row sums to one, or is all zeros if the row has
        no allowed key.

    Raises:
        TypeError: ``scores`` is not a floating-point tensor, or ``mask`` is not boolean.
        ValueError: ``mask`` does not broadcast to ``scores``.
    """
    if not isinstance(scores, Tensor) or not scores.is_floating_point():
        raise TypeError(f"scores must be a floating-point torch.Tensor, got {_describe(scores)}")
    input_dtype = scores.dtype
    scores = scores.to(_compute_dtype(input_dtype))  # float16/bfloat16 -> float32, else unchanged
    if mask is None:
        return torch.softmax(scores, dim=-1).to(input_dtype)
    check_mask(mask, scores.shape)
    mask = mask.to(scores.device)  # a mask built on the CPU also works for a model on the GPU
    # torch.where gives the same values and gradients as masked_fill(~mask, ...), but without inverting the
    # mask and, on a CPU, several times faster when a (L, L) mask broadcasts over the batch and the heads.
    scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    # Blocked keys get exactly zero. This covers a row with no allowed key (its softmax is uniform over
    # blocked keys, which must not leak through) and allowed scores at or below the fill value.
    return torch.where(mask, weights, 0.0).to(input_dtype)


def _describe(x: object) -> str:
    return f"a tensor of dtype {x.dtype}" if isinstance(x, Tensor) else type(x).__name__


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype softmax and its matrix products run in: float32 for half-precision inputs."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _without_autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """Switch autocast off, so that the ``float32`` computation asked for is not cast back to half."""
    if device.type in ("cpu", "cuda"):
        return torch.autocast(device_type=device.type, enabled=False)
    return contextlib.nullcontext()


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Attention(Q, K, V) = softmax(Q Kᵀ · scale + bias) V, returning the output and the attention weights.

    This is the library's one attention kernel: multi-head, grouped-query (through
    :func:`~attention_course.grouped_query_attention`), ALiBi's additive bias and half precision all run here.

    Args:
        query: ``(..., Lq, d_k)``.
        key: ``(..., Lk, d_k)``.
        value: ``(..., Lk, d_v)``; ``d_v`` may differ from ``d_k``.
        mask: optional boolean tensor broadcastable to the scores ``(..., Lq, Lk)``; **True = may attend**.
            A query row with no allowed key gets zero weights and a zero output.
        dropout_p: probability of dropping each attention weight (inverted dropout: survivors are scaled by
            ``1 / (1 - dropout_p)``). There is no ``training`` flag, as in
            ``torch.nn.functional.scaled_dot_product_attention``: the caller passes 0 at evaluation time
            (:class:`~attention_course.MultiHeadAttention` does this from ``self.training``).
        scale: factor applied to ``Q Kᵀ``; defaults to ``1 / √d_k``, which keeps the scores' variance near 1
            when the entries of Q and K have unit variance.
        bias: optional floating-point tensor broadcastable to the scores ``(..., Lq, Lk)`` (without enlarging
            them), added to the scaled scores before the softmax: ALiBi's distance penalty
            (:func:`~attention_course.alibi_bias`) or any other additive score bias.

    The leading (batch) dimensions of query, key and value must be equal or broadcast (for example one key
    set shared by all heads).

    Returns:
        ``(output, weights)``: ``output`` is ``(..., Lq, d_v)``; ``weights`` is ``(..., Lq, Lk)``, the
        attention distribution before dropout (each row sums to one, or is all zeros for a fully masked
        row). With ``dropout_p > 0`` the output uses the dropped-out weights.

    Half precision: with ``float16`` or ``bfloat16`` inputs the scores, the softmax and the weighted sum are
    computed in ``float32`` (autocast is switched off inside) and both results are returned in the input
    dtype, so large scores cannot overflow and masked keys never receive weight.

    Raises:
        ValueError: mismatched ``d_k`` or ``Lk``, leading dimensions that do not broadcast, inputs on different
            devices, a mask or bias that does not broadcast to the scores, or ``dropout_p`` outside ``[0, 1)``.
        TypeError: a non-boolean mask, a non-floating bias, or query, key and value of different (or
            non-floating-point) dtypes.
    """
    check_qkv(query, key, value)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if scale is None:
        scale = 1.0 / math.sqrt(query.size(-1))
    if bias is not None:
        check_bias(bias, (*torch.broadcast_shapes(query.shape[:-2], key.shape[:-2]), query.size(-2), key.size(-2)))

    # Half precision (float16/bfloat16, e.g. under autocast on a GPU): compute in float32 and round once at
    # the end. In float16 the scores overflow beyond +-65504, and a masked key could then outweigh them.
    dtype = query.dtype
    compute = _compute_dtype(dtype)
    with _without_autocast(query.device):
        query, key, value = query.to(compute), key.to(compute), value.to(compute)
        # Scale the (Lq, d_k) queries rather than the (Lq, Lk) scores: same result, fewer multiplications.
        scores = torch.matmul(query * scale, key.transpose(-2, -1))  # (..., Lq, Lk)
        if bias is not None:
            scores = scores + bias.to(device=scores.device, dtype=compute)  # in float32 for half inputs
        weights = masked_softmax(scores, mask)  # (..., Lq, Lk)
        attended = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights
        output = torch.matmul(attended, value)  # (..., Lq, d_v)
    return output.to(dtype), weights.to(dtype)
