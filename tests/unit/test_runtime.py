"""Device choice and seeding as a GPU runtime sees them, exercised on the CPU.

A Colab GPU runtime differs from CI in two ways these tests reproduce: ``torch.cuda.is_available()`` is True,
and a learner may still choose the CPU. Both are simulated by monkeypatching, so the GPU branches run here.
"""

from __future__ import annotations

import pytest
import torch

import attention_course as ac
from attention_course import runtime


@pytest.fixture
def gpu_runtime(monkeypatch):
    """Pretend a GPU is present; restore the course device and torch's determinism flags afterwards."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("ATTENTION_COURSE_DEVICE", raising=False)
    monkeypatch.setattr(runtime, "_course_device", None)
    flags = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    yield
    torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = flags[2], flags[3]


def test_workload_follows_the_device_the_notebook_chose_not_the_hardware(gpu_runtime):
    assert ac.workload(cpu=10, gpu=100) == 100  # nothing chosen yet: the default device, CUDA here
    device = ac.get_device("cpu")  # the learner picks the CPU on a GPU runtime
    assert device == torch.device("cpu")
    assert ac.workload(cpu=10, gpu=100) == 10
    assert not ac.on_gpu()
    assert ac.get_device() == torch.device("cuda")  # choosing the GPU again switches back
    assert ac.workload(cpu=10, gpu=100) == 100


def test_workload_with_an_explicit_device_ignores_the_course_device(gpu_runtime):
    ac.get_device("cuda")
    assert ac.workload(cpu=[1, 2], gpu=[3, 4], device=torch.device("cpu")) == [1, 2]
    assert ac.workload(cpu=[1, 2], gpu=[3, 4], device="cpu") == [1, 2]
    assert ac.workload(cpu=[1, 2], gpu=[3, 4], device=torch.device("cuda", 0)) == [3, 4]
    assert ac.workload(cpu=1, gpu=2, device="cuda:0") == 2
    with pytest.raises(TypeError, match="device must be"):
        ac.workload(cpu=1, gpu=2, device=0)


def test_environment_override_pins_the_course_device_to_the_cpu(gpu_runtime, monkeypatch):
    monkeypatch.setenv("ATTENTION_COURSE_DEVICE", "cpu")
    assert ac.get_device() == torch.device("cpu")
    assert ac.workload(cpu=10, gpu=100) == 10


def test_get_device_accepts_a_torch_device(gpu_runtime):
    assert ac.get_device(torch.device("cpu")) == torch.device("cpu")
    assert ac.workload(cpu=10, gpu=100) == 10


def test_seed_everything_on_a_gpu_runtime_leaves_the_warn_only_flag_off(gpu_runtime):
    """On CUDA the flag would only print warnings (chapter 01's cross-entropy); cuDNN is made deterministic."""
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic = False
    torch.backends.cudnn.benchmark = True
    ac.seed_everything(0)
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark


def test_seed_everything_leaves_the_global_flag_alone_on_the_cpu(monkeypatch):
    """CPU kernels are deterministic already; the flag would only cost a compiler import per process."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        for flag in (False, True):
            torch.use_deterministic_algorithms(flag)
            for deterministic in (True, False):
                ac.seed_everything(0, deterministic=deterministic)
                assert torch.are_deterministic_algorithms_enabled() is flag
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def test_the_library_uses_no_private_pytorch_api():
    """Private names (``torch._C``, ``torch._foo``) change without notice between releases; Colab's torch is
    not CI's. The library, grader included, uses only torch's public API."""
    import ast
    from pathlib import Path

    private = []
    for path in sorted(Path(ac.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = node.value
                while isinstance(base, ast.Attribute):
                    base = base.value
                if isinstance(base, ast.Name) and base.id in {"torch", "F", "nn"}:
                    private.append(f"{path.name}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("torch") and any(
                            part.startswith("_") and not part.startswith("__") for part in alias.name.split(".")):
                        private.append(f"{path.name}:{node.lineno} import {alias.name}")
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torch"):
                parts = node.module.split(".") + [alias.name for alias in node.names]
                if any(part.startswith("_") and not part.startswith("__") for part in parts):
                    private.append(f"{path.name}:{node.lineno} from {node.module} import ...")
    assert private == [], f"private PyTorch names in the library: {private}"

