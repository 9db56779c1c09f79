"""Reproducibility and device choice: the two calls every notebook makes first.

Notebooks call :func:`seed_everything` so that re-running gives the same text outputs, and
:func:`get_device` so that the same cell runs on a laptop CPU, in CI, and on a Colab GPU. Work sizes
that should grow with the hardware go through :func:`workload`, which returns the CPU budget (what keeps a
lesson within its runtime budget on two cores) or the GPU budget. An author can force either budget on any
device with the environment variable ``ATTENTION_COURSE_WORKLOAD`` (``make gpu-check`` sets it to ``gpu`` to
check every claim at the sizes a GPU learner gets, on a machine without a GPU).
"""

from __future__ import annotations

import os
import random
from typing import TypeVar

import numpy as np
import torch

T = TypeVar("T")

__all__ = ["WORKLOAD_ENV", "BF16_NATIVE_CAPABILITY", "autocast_dtype", "fused_adam", "seed_everything",
           "get_device", "on_gpu", "workload"]

#: The environment variable that forces :func:`workload`'s choice: ``gpu`` (GPU sizes even on the CPU, for
#: checking a GPU learner's claims without a GPU) or ``cpu``; unset or empty, the device decides.
WORKLOAD_ENV = "ATTENTION_COURSE_WORKLOAD"


def seed_everything(seed: int = 0, *, deterministic: bool = True) -> torch.Generator:
    """Seed Python's ``random``, NumPy and torch (CPU and CUDA) with one call.

    Args:
        seed: the seed; lessons use the default 0 unless they compare runs.
        deterministic: also make cuDNN and cuBLAS deterministic (they matter only on a GPU). Torch's
            global deterministic-algorithms flag is left as it is; see the comment in the code for why.

    Returns:
        A ``torch.Generator`` seeded with ``seed``, for code that wants a private stream of random numbers.
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        # torch.use_deterministic_algorithms is not called. On the CPU the kernels the course runs are
        # already deterministic for a given number of threads: with the flag on, a training run gave the
        # same losses and weights bit for bit, and the call itself imports the compiler's configuration
        # (about a second per process, paid by every lesson). On CUDA some kernels the lessons use
        # (chapter 01's cross-entropy over (batch, classes, length) logits, scatter-adds in embedding
        # backward passes) have no deterministic version: in warn-only mode they still run
        # non-deterministically, so the flag would buy nothing except a UserWarning under the learner's
        # cell. GPU runs therefore promise equal results up to rounding, not bit for bit.
    return torch.Generator().manual_seed(seed)


def get_device(prefer: str | torch.device | None = None) -> torch.device:
    """The device lessons run on: CUDA when present, else CPU.

    The device returned becomes the *course device*, the default of :func:`workload` and :func:`on_gpu`:
    a learner who writes ``device = ac.get_device("cpu")`` on a GPU runtime gets CPU-sized work too.

    Args:
        prefer: ``"cpu"`` or ``"cuda"`` to override the choice (``"cuda"`` raises when there is no GPU).
            The environment variable ``ATTENTION_COURSE_DEVICE`` overrides it the same way, so a whole
            book build can be pinned to the CPU.

    Returns:
        ``torch.device("cuda")`` or ``torch.device("cpu")``.

    Raises:
        ValueError: an unknown device name, or ``"cuda"`` without a GPU.
    """
    global _course_device
    choice = prefer or os.environ.get("ATTENTION_COURSE_DEVICE")
    if isinstance(choice, torch.device):
        choice = choice.type
    if choice is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    elif choice not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {choice!r}")
    elif choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for, but torch.cuda.is_available() is False")
    else:
        device = torch.device(choice)
    _course_device = device
    return device


_course_device: torch.device | None = None  # the last device get_device() returned


def _as_device(device: torch.device | str | None) -> torch.device:
    if device is None:
        return _course_device if _course_device is not None else get_device()
    if isinstance(device, str):
        return torch.device(device)
    if isinstance(device, torch.device):
        return device
    raise TypeError(f"device must be a torch.device, a string such as 'cpu', or None; got {device!r}")


def on_gpu(device: torch.device | str | None = None) -> bool:
    """Whether ``device`` is a GPU; by default the course device (the last :func:`get_device` result)."""
    return _as_device(device).type == "cuda"


def workload(cpu: T, gpu: T, device: torch.device | str | None = None) -> T:
    """Pick a work size by device: ``cpu`` keeps a lesson inside its CPU budget, ``gpu`` uses a free GPU.

    Args:
        cpu: the size for a CPU run.
        gpu: the size for a GPU run.
        device: the device the work will run on. Lessons pass the ``device`` they train on; the default
            is the course device, the last one :func:`get_device` returned (not merely whether a GPU
            exists), so choosing the CPU on a GPU runtime also chooses the CPU budget.

    Returns:
        ``gpu`` when ``device`` is a CUDA device, else ``cpu``; the environment variable
        ``ATTENTION_COURSE_WORKLOAD`` (``gpu`` or ``cpu``), when set, overrides the device.

    Raises:
        ValueError: ``ATTENTION_COURSE_WORKLOAD`` set to anything but ``gpu``, ``cpu`` or empty.

    Example:
        >>> steps = workload(cpu=300, gpu=3000, device=torch.device("cpu"))   # training steps
        >>> steps
        300
    """
    forced = os.environ.get(WORKLOAD_ENV, "").strip().lower()
    if forced not in ("", "cpu", "gpu"):
        raise ValueError(f"{WORKLOAD_ENV} must be 'gpu', 'cpu' or empty, got {forced!r}")
    if forced:
        _as_device(device)  # a device of the wrong type is an error all the same
        return gpu if forced == "gpu" else cpu
    return gpu if on_gpu(device) else cpu


#: The CUDA compute capability from which a GPU runs bfloat16 arithmetic natively, Ampere's (A100, RTX 30xx).
BF16_NATIVE_CAPABILITY = (8, 0)


def autocast_dtype(
    device: torch.device | str | None = None, capability: tuple[int, int] | None = None
) -> torch.dtype | None:
    """The 16-bit type to train in under ``torch.autocast`` on ``device``, or None for float32.

    bfloat16 where the GPU runs it natively (compute capability 8.0 or newer); float16 on older GPUs, such
    as Colab's free T4 (7.5), where float16 needs a gradient scaler (``torch.amp.GradScaler``) so that
    small gradients do not flush to zero; None on a CPU. ``torch.cuda.is_bf16_supported()`` is not the
    test: it can report True on a GPU that only emulates bfloat16, slowly.

    Args:
        device: the device the model trains on (default: the course device).
        capability: the GPU's compute capability as ``(major, minor)``; by default it is asked of the
            GPU. Passing it forces the choice, which lets the float16 path be tested anywhere.

    Returns:
        ``torch.bfloat16``, ``torch.float16``, or ``None`` on a CPU.

    Raises:
        ValueError: ``capability`` that is not a pair of non-negative ints.
    """
    device = _as_device(device)
    if capability is not None:
        if (not isinstance(capability, tuple) or len(capability) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in capability)):
            raise ValueError(f"capability must be a (major, minor) pair of ints such as (7, 5), got {capability!r}")
    elif device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
    else:
        return None
    return torch.bfloat16 if tuple(capability) >= BF16_NATIVE_CAPABILITY else torch.float16


def fused_adam(device: torch.device | str | None = None) -> bool | None:
    """The ``fused=`` argument for ``torch.optim.Adam`` and ``AdamW`` on ``device``.

    True on a CPU: there PyTorch's default is a Python loop over the parameters with several small
    operations each, which costs a small model more than its matrix products; the fused kernel updates
    every parameter in one call, with the same update up to float rounding. None elsewhere: PyTorch then
    chooses (its multi-tensor ``foreach`` implementation on a GPU).

    Args:
        device: the device of the parameters (default: the course device).
    """
    return True if _as_device(device).type == "cpu" else None
