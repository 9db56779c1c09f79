"""Argument checks shared by the library's modules, so that one kind of bad input gets one kind of message.

Each function raises ``TypeError`` for a value of the wrong type and ``ValueError`` for a value of the
right type that is out of range or of the wrong shape, naming the argument and what it got.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["check_bool", "check_int", "check_rank", "check_tensor"]


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
