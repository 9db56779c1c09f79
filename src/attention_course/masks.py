"""Boolean attention masks. True means "may attend", as in ``torch.nn.functional.scaled_dot_product_attention``.

Shapes, for scores of shape ``(B, H, Lq, Lk)`` (batch, heads, queries, keys):

- :func:`causal_mask` ``(L, L)``: broadcasts to every batch item and head (self-attention, Lq = Lk = L).
- :func:`padding_mask` ``(B, 1, 1, Lk)``: hides padded *keys* for every head and every query.
- :func:`sliding_window_mask` ``(L, L)``: causal, and at most ``window`` keys back (Longformer, Mistral).
- :func:`combine_masks` ANDs masks together, e.g. a decoder's ``(B, 1, L, L)`` causal-and-padding mask.

``torch.nn.MultiheadAttention`` uses the opposite convention (True = blocked); convert with ``~mask``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attention_course.checks import check_int

__all__ = ["causal_mask", "combine_masks", "padding_mask", "sliding_window_mask", "window_mask"]


def window_mask(query_positions: Tensor, key_positions: Tensor, window: int | None = None) -> Tensor:
    """The causal (sliding-window) rule at explicit positions, written once for the whole library.

    Query at position ``i`` may attend to the key at position ``j`` when ``0 <= i - j`` (causal) and, with a
    window, ``i - j < window``. :func:`sliding_window_mask` applies it to ``0..L-1``; a KV-cached decoding
    step applies it to its new queries and the keys its cache holds.

    Args:
        query_positions: ``(Lq,)`` integer positions of the queries.
        key_positions: ``(Lk,)`` integer positions of the keys.
        window: None (the whole causal past) or how many keys each query sees, itself included.

    Returns:
        ``(Lq, Lk)`` bool, True = may attend.
    """
    if window is not None:
        check_int("window", window)
    offset = query_positions[:, None] - key_positions[None, :]  # (Lq, Lk): how far back each key is
    allowed = offset >= 0
    return allowed if window is None else allowed & (offset < window)


def causal_mask(size: int, device: torch.device | str | None = None) -> Tensor:
    """Mask that lets query ``i`` attend to keys ``j <= i`` only (no peeking at future tokens).

    Args:
        size: sequence length L (a positive int).
        device: where to create the mask.

    Returns:
        ``(size, size)`` bool tensor, True on and below the diagonal.

    Example:
        >>> causal_mask(3).int()
        tensor([[1, 0, 0],
                [1, 1, 0],
                [1, 1, 1]], dtype=torch.int32)
    """
    check_int("size", size)
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()


def sliding_window_mask(length: int, window: int, device: torch.device | str | None = None) -> Tensor:
    """Causal sliding-window mask: query ``i`` may attend to keys ``j`` with ``0 <= i - j < window``.

    Each query sees itself and the ``window - 1`` tokens before it (Beltagy et al. 2020 use a symmetric
    window in an encoder; decoder-only models such as Mistral use this causal one). With ``window >= length``
    it equals :func:`causal_mask`. A stack of ``n`` such layers still carries information from up to
    ``n · (window - 1)`` tokens back, one window per layer.

    Args:
        length: sequence length L (a positive int).
        window: how many keys each query sees, itself included (a positive int).
        device: where to create the mask.

    Returns:
        ``(length, length)`` bool tensor, a band of width ``window`` on and below the diagonal.

    Example:
        >>> sliding_window_mask(4, 2).int()
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0],
                [0, 1, 1, 0],
                [0, 0, 1, 1]], dtype=torch.int32)
    """
    for name, value in (("length", length), ("window", window)):
        check_int(name, value)
    positions = torch.arange(length, device=device)
    return window_mask(positions, positions, window)  # (L, L)


def padding_mask(token_ids: Tensor, pad_id: int) -> Tensor:
    """Mask that hides padding tokens when they are used as keys.

    Args:
        token_ids: ``(B, Lk)`` integer token ids.
        pad_id: the id of the padding token.

    Returns:
        ``(B, 1, 1, Lk)`` bool tensor, False where ``token_ids == pad_id``. It broadcasts over heads and over
        queries against scores of shape ``(B, H, Lq, Lk)``. Padded *queries* are not masked: their outputs
        are computed but later ignored (by the loss, for instance), which keeps every row finite.
    """
    if not isinstance(token_ids, Tensor):
        raise TypeError(f"token_ids must be a torch.Tensor, got {type(token_ids).__name__}")
    if token_ids.dim() != 2:
        raise ValueError(f"token_ids must have shape (batch, length), got shape {tuple(token_ids.shape)}")
    if token_ids.is_floating_point() or token_ids.is_complex() or token_ids.dtype == torch.bool:
        raise TypeError(f"token_ids must hold integer token ids, got dtype {token_ids.dtype}")
    if isinstance(pad_id, bool) or not isinstance(pad_id, int):
        raise TypeError(f"pad_id must be an int, got {pad_id!r}")
    return (token_ids != pad_id)[:, None, None, :]  # (B, 1, 1, Lk)


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """AND together boolean masks (True = may attend), broadcasting their shapes; ``None`` entries are skipped.

    Example: a decoder's self-attention mask ``combine_masks(padding_mask(tgt, pad), causal_mask(L))`` has
    shape ``(B, 1, L, L)``: query ``i`` sees key ``j`` only if ``j <= i`` and token ``j`` is not padding.

    Returns:
        The combined mask, or ``None`` if every argument is ``None``.
    """
    combined: Tensor | None = None
    for index, mask in enumerate(masks):
        if mask is None:
            continue
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
            raise TypeError(f"mask {index} must be a bool tensor (True = may attend), got {got}")
        if combined is None:
            combined = mask
            continue
        try:
            torch.broadcast_shapes(combined.shape, mask.shape)
        except RuntimeError:
            raise ValueError(
                f"mask {index} of shape {tuple(mask.shape)} does not broadcast with the masks before it "
                f"(combined shape {tuple(combined.shape)})"
            ) from None
        combined = combined & mask
    return combined


def source_mask(src: Tensor, pad_id: int | None, src_mask: Tensor | None) -> Tensor | None:
    """``src_mask`` when given, else the padding mask ``(B, 1, 1, Ls)`` of ``src`` built from ``pad_id``, or None
    without one: the source mask every decoder uses."""
    if src_mask is not None:
        return src_mask
    return padding_mask(src, pad_id) if pad_id is not None else None
