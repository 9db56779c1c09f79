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



def test_workload_environment_forces_the_gpu_sizes_on_the_cpu(monkeypatch):
    """make gpu-check sets ATTENTION_COURSE_WORKLOAD=gpu to check a GPU learner's claims without a GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(runtime, "_course_device", None)
    monkeypatch.delenv("ATTENTION_COURSE_DEVICE", raising=False)
    monkeypatch.setenv("ATTENTION_COURSE_WORKLOAD", "gpu")
    assert ac.get_device() == torch.device("cpu") and not ac.on_gpu()  # the device stays the CPU
    assert ac.workload(cpu=10, gpu=100) == 100
    assert ac.workload(cpu=10, gpu=100, device="cpu") == 100
    monkeypatch.setenv("ATTENTION_COURSE_WORKLOAD", "cpu")
    assert ac.workload(cpu=10, gpu=100, device="cuda") == 10
    monkeypatch.setenv("ATTENTION_COURSE_WORKLOAD", "")
    assert ac.workload(cpu=10, gpu=100, device="cpu") == 10
    assert ac.workload(cpu=10, gpu=100, device="cuda") == 100
    monkeypatch.setenv("ATTENTION_COURSE_WORKLOAD", "GPU ")  # case and spaces do not matter
    assert ac.workload(cpu=10, gpu=100) == 100


def test_workload_environment_rejects_an_unknown_value(monkeypatch):
    monkeypatch.setenv("ATTENTION_COURSE_WORKLOAD", "tpu")
    with pytest.raises(ValueError, match="ATTENTION_COURSE_WORKLOAD must be 'gpu', 'cpu' or empty, got 'tpu'"):
        ac.workload(cpu=1, gpu=2, device="cpu")
    monkeypatch.setenv("ATTENTION_COURSE_WORKLOAD", "gpu")
    with pytest.raises(TypeError, match="device must be"):
        ac.workload(cpu=1, gpu=2, device=0)


def test_autocast_dtype_is_bfloat16_only_where_the_gpu_runs_it_natively():
    assert runtime.autocast_dtype("cpu") is None
    assert runtime.autocast_dtype("cpu", capability=(7, 5)) is torch.float16  # a T4: forced choice
    assert runtime.autocast_dtype("cpu", capability=(7, 0)) is torch.float16  # a V100
    assert runtime.autocast_dtype("cpu", capability=(8, 0)) is torch.bfloat16  # an A100
    assert runtime.autocast_dtype("cpu", capability=(9, 0)) is torch.bfloat16  # an H100
    for bad in [(8,), "8.0", (8, -1), (8.0, 0), (True, 0)]:
        with pytest.raises(ValueError, match="capability must be a"):
            runtime.autocast_dtype("cpu", capability=bad)


def test_autocast_dtype_asks_the_gpu_for_its_capability(gpu_runtime, monkeypatch):
    """torch.cuda.is_bf16_supported() may say True on a T4 (emulated); the capability decides."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    for capability, expected in [((7, 5), torch.float16), ((8, 6), torch.bfloat16)]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        assert runtime.autocast_dtype("cuda") is expected


def test_the_float16_path_trains_with_a_gradient_scaler_on_the_cpu():
    """The T4 path (float16 autocast and a GradScaler), forced on the CPU: the loss falls, weights stay float32."""
    dtype = runtime.autocast_dtype("cpu", capability=(7, 5))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", enabled=dtype is torch.float16)
    x = torch.randn(64, 8)
    y = x[:, :1] - 2 * x[:, 1:2]
    losses = []
    for _ in range(30):
        with torch.autocast("cpu", dtype=dtype):
            prediction = model(x)
            assert prediction.dtype is torch.float16  # the matrix products ran in float16
            loss = torch.nn.functional.mse_loss(prediction.float(), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    assert scaler.is_enabled() and scaler.get_scale() > 1  # the scaler was in use
    assert all(p.dtype is torch.float32 and torch.isfinite(p).all() for p in model.parameters())
    assert losses[-1] < 0.5 * losses[0]


def test_fused_adam_is_chosen_on_the_cpu_only():
    assert runtime.fused_adam("cpu") is True
    assert runtime.fused_adam(torch.device("cpu")) is True
    # Elsewhere PyTorch keeps its own choice (foreach on a GPU): no device is queried, so this runs anywhere.
    assert runtime.fused_adam("cuda") is None
    assert runtime.fused_adam("meta") is None


@pytest.mark.parametrize("optimizer_class", [torch.optim.Adam, torch.optim.AdamW])
def test_fused_adam_gives_the_same_updates_as_the_per_parameter_loop(optimizer_class):
    """The fused kernel the library asks for on a CPU is the same algorithm as PyTorch's default loop."""
    parameters = {}
    for fused in (None, runtime.fused_adam("cpu")):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))
        optimizer = optimizer_class(model.parameters(), lr=3e-2, betas=(0.9, 0.95), weight_decay=0.1, fused=fused)
        x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
        for _ in range(20):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        parameters[fused] = [p.detach().clone() for p in model.parameters()]
    for reference, fused in zip(parameters[None], parameters[True]):
        torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-6)
