"""The key–value cache of one attention layer, optionally rolling (keeping only a sliding window).

When a decoder generates token ``t``, the keys and values of tokens ``0..t-1`` are the same as at the previous
step. :class:`KVCache` keeps them, so each step projects only the new tokens. With ``window=w`` it keeps only
the last ``w`` positions, which is all that sliding-window attention ever reads: its memory stops growing.

Pass a cache to :class:`~attention_course.MultiHeadAttention` (``forward(..., cache=cache)``), or to a layer
(``EncoderLayer.forward(x, mask, cache=...)``, ``DecoderLayer.forward(..., cache=...)``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from attention_course.checks import check_int

__all__ = ["KVCache"]


class KVCache:
    """The keys and values one attention layer has computed so far, grown by :meth:`append`.

    Args:
        window: None (keep everything) or the number of most recent positions to keep (a rolling cache
            for sliding-window attention with that window).

    Attributes:
        keys: ``(B, Hkv, t, d_head)`` the kept keys, or None before the first append.
        values: ``(B, Hkv, t, d_head_v)`` or None.
        position: how many positions have been appended in all (the position of the next token); with a
            window this exceeds ``len(cache)`` once the window is full.

    Appending concatenates along the length dimension. (Production caches preallocate ``max_len`` slots, or
    a ring buffer of ``window`` slots, and write in place, which avoids the copy; the concatenation keeps the
    idea visible.)
    """

    def __init__(self, window: int | None = None) -> None:
        if window is not None:
            check_int("window", window)
        self.window = window
        self.keys: Tensor | None = None
        self.values: Tensor | None = None
        self.position = 0

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.size(-2)

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Add the keys and values of new positions; return the kept ones followed by the new ones.

        Args:
            keys: ``(B, H, t_new, d_head)``.
            values: ``(B, H, t_new, d_head_v)``.

        Returns:
            ``(keys, values)`` of shape ``(B, H, t_kept + t_new, ...)``: every position so far without a
            window; with a window, the ``window`` positions kept before this call and the new ones (the
            new queries need them all), of which only the last ``window`` are kept afterwards. They are
            positions ``position - t_kept - t_new .. position - 1`` (``position`` after the call).

        Raises:
            ValueError: not 4-D, keys and values that disagree on (B, H, t_new), or shapes that differ
                from what the cache already holds (other than the length).
        """
        for name, tensor in (("keys", keys), ("values", values)):
            if not isinstance(tensor, Tensor) or tensor.dim() != 4:
                shape = tuple(tensor.shape) if isinstance(tensor, Tensor) else type(tensor).__name__
                raise ValueError(f"{name} must have shape (batch, heads, new_length, d_head), got {shape}")
        if keys.shape[:3] != values.shape[:3]:
            raise ValueError(
                f"keys {tuple(keys.shape)} and values {tuple(values.shape)} must agree on (batch, heads, length)"
            )
        if self.keys is None or self.values is None:
            all_keys, all_values = keys, values
        else:
            for name, new, old in (("keys", keys, self.keys), ("values", values, self.values)):
                if new.shape[:2] != old.shape[:2] or new.shape[3] != old.shape[3]:
                    raise ValueError(
                        f"new {name} of shape {tuple(new.shape)} do not match the cached {name} of shape "
                        f"{tuple(old.shape)} (batch, heads and d_head must stay the same)"
                    )
            all_keys = torch.cat([self.keys, keys], dim=2)  # (B, H, t + t_new, d_head)
            all_values = torch.cat([self.values, values], dim=2)
        self.position += keys.size(2)
        if self.window is None:
            self.keys, self.values = all_keys, all_values
        elif all_keys.size(2) <= self.window:
            self.keys, self.values = all_keys, all_values
        else:  # a rolling cache: only the last `window` positions can ever be attended to again. clone():
            # a slice would keep the whole longer tensor alive, and the memory would not shrink.
            self.keys = all_keys[:, :, -self.window:].clone()
            self.values = all_values[:, :, -self.window:].clone()
        return all_keys, all_values
