"""Argument checks shared by the library's modules, so that one kind of bad input gets one kind of message.

Each function raises ``TypeError`` for a value of the wrong type and ``ValueError`` for a value of the
right type that is out of range or of the wrong shape, naming the argument and what it got.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["check_bool", "check_decoding_args", "check_int", "check_qkv", "check_rank", "check_tensor"]


def check_int(name: str, value: object, minimum: int = 1) -> None:
    """Raise unless ``value`` is an int (not a bool) of at least ``minimum``.

    Raises:
        TypeError: ``value`` is not an int (bools are refused: ``True`` is not a size).
        ValueError: ``value < minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")


def check_bool(name: str, value: object) -> None:
    """Raise ``TypeError`` unless ``value`` is a bool (1 and 0 are refused: they hide a mistaken argument)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def check_tensor(name: str, value: object, floating: bool = False) -> None:
    """Raise ``TypeError`` unless ``value`` is a tensor (of a floating-point dtype if ``floating``)."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if floating and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")


def check_rank(name: str, value: Tensor, rank: int, layout: str) -> None:
    """Raise ``ValueError`` unless ``value`` has exactly ``rank`` dimensions; ``layout`` names them."""
    if value.dim() != rank:
        raise ValueError(f"{name} must have shape {layout}, got {tuple(value.shape)}")


def check_qkv(query: Tensor, key: Tensor, value: Tensor) -> None:
    """Raise unless query ``(..., Lq, d_k)``, key ``(..., Lk, d_k)`` and value ``(..., Lk, d_v)`` fit together.

    Raises:
        TypeError: a non-tensor, a non-floating dtype, or dtypes that differ.
        ValueError: too few dimensions, different devices, d_k or Lk that disagree, or leading dimensions
            that do not broadcast.
    """
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if not tensor.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {tensor.dtype}")
        if tensor.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (..., length, features), got shape "
                             f"{tuple(tensor.shape)}")
    if not query.dtype == key.dtype == value.dtype:
        raise TypeError(
            f"query, key and value must share one dtype, got query {query.dtype}, key {key.dtype} and "
            f"value {value.dtype}; convert them, for example with key.to(query.dtype)"
        )
    if not query.device == key.device == value.device:
        raise ValueError(
            f"query, key and value must be on one device, got query on {query.device}, key on {key.device} "
            f"and value on {value.device}"
        )
    if query.size(-1) != key.size(-1):
        raise ValueError(
            f"query and key must have the same feature size d_k, got query {tuple(query.shape)} "
            f"(d_k={query.size(-1)}) and key {tuple(key.shape)} (d_k={key.size(-1)})"
        )
    if key.size(-2) != value.size(-2):
        raise ValueError(
            f"key and value must have the same length Lk, got key {tuple(key.shape)} (Lk={key.size(-2)}) and "
            f"value {tuple(value.shape)} (Lk={value.size(-2)})"
        )
    try:
        torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"the leading (batch) dimensions of query {tuple(query.shape)}, key {tuple(key.shape)} and value "
            f"{tuple(value.shape)} do not broadcast together"
        ) from None


def check_decoding_args(src: Tensor, max_len: int, bos_id: int, eos_id: int) -> None:
    """Raise unless the arguments every decoder shares are usable: ``src`` ``(B, Ls)`` integer ids, a positive
    ``max_len`` and non-negative ``bos_id`` and ``eos_id``."""
    if not isinstance(src, Tensor) or src.dim() != 2:
        shape = tuple(src.shape) if isinstance(src, Tensor) else type(src).__name__
        raise ValueError(f"src must be a (batch, length) tensor of token ids, got {shape}")
    if src.is_floating_point() or src.dtype == torch.bool:
        raise TypeError(f"src must hold integer token ids, got dtype {src.dtype}")
    check_int("max_len", max_len)
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
        check_int(name, value, minimum=0)
