"""Reproducibility and device choice: the two calls every notebook makes first.

Notebooks call :func:`seed_everything` so that re-running gives the same text outputs, and
:func:`get_device` so that the same cell runs on a laptop CPU, in CI, and on a Colab GPU. Work sizes
that should grow with the hardware go through :func:`workload`, which returns the CPU budget (what keeps a
lesson within its runtime budget on two cores) or the GPU budget.
"""

from __future__ import annotations

import os
import random
import sys
from typing import TypeVar

import numpy as np
import torch

T = TypeVar("T")

__all__ = ["seed_everything", "get_device", "on_gpu", "workload"]


def seed_everything(seed: int = 0, *, deterministic: bool = True) -> torch.Generator:
    """Seed Python's ``random``, NumPy and torch (CPU and CUDA) with one call.

    Args:
        seed: the seed; lessons use the default 0 unless they compare runs.
        deterministic: also ask torch for deterministic kernels where they exist (warn-only, so that a
            kernel without a deterministic version never raises inside a lesson).

    Returns:
        A ``torch.Generator`` seeded with ``seed``, for code that wants a private stream of random numbers.
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        _use_deterministic_kernels()
        torch.backends.cudnn.benchmark = False
    return torch.Generator().manual_seed(seed)


def _use_deterministic_kernels() -> None:
    """``torch.use_deterministic_algorithms(True, warn_only=True)``, without its import of the compiler.

    The public call also sets ``torch.compile``'s own determinism flag, and importing the compiler's
    configuration to do so takes about 2 s: a quarter of a short notebook's run, paid by every notebook. The
    course never compiles, so unless the compiler is already loaded only the kernels' flag is set.
    """
    set_kernel_flag = getattr(torch._C, "_set_deterministic_algorithms", None)
    if set_kernel_flag is None or "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        set_kernel_flag(True, warn_only=True)


def get_device(prefer: str | None = None) -> torch.device:
    """The device lessons run on: CUDA when present, else CPU.

    Args:
        prefer: ``"cpu"`` or ``"cuda"`` to override the choice (``"cuda"`` raises when there is no GPU).
            The environment variable ``ATTENTION_COURSE_DEVICE`` overrides it the same way, so a whole
            book build can be pinned to the CPU.
    """
    choice = prefer or os.environ.get("ATTENTION_COURSE_DEVICE")
    if choice is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {choice!r}")
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for, but torch.cuda.is_available() is False")
    return torch.device(choice)


def on_gpu(device: torch.device | None = None) -> bool:
    """Whether ``device`` (default: :func:`get_device`) is a GPU."""
    return (device or get_device()).type == "cuda"


def workload(cpu: T, gpu: T, device: torch.device | None = None) -> T:
    """Pick a work size by device: ``cpu`` keeps a lesson inside its CPU budget, ``gpu`` uses a free GPU.

    Example:
        >>> steps = workload(cpu=300, gpu=3000)   # training steps
    """
    return gpu if on_gpu(device) else cpu
