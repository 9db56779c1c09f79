"""The foundations every notebook uses: seeding, device choice, workload sizes, source display, plots."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import matplotlib
import numpy as np
import pytest
import torch

import attention_course as ac
from attention_course import plotting

matplotlib.use("Agg")


def draw_all_generators():
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_seed_everything_makes_python_numpy_and_torch_repeatable():
    ac.seed_everything(123)
    first = draw_all_generators()
    ac.seed_everything(123)
    assert draw_all_generators() == first
    ac.seed_everything(124)
    assert draw_all_generators() != first


def modules_loaded_by(statement: str, *modules: str) -> list[bool]:
    """In a fresh interpreter: import the course, run ``statement``, report which of ``modules`` got imported."""
    code = (f"import json, sys, attention_course as ac; {statement}; "
            f"print(json.dumps([m in sys.modules for m in {list(modules)!r}]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def test_seeding_imports_no_compiler():
    """Every lesson seeds first: it must not pay the second that importing torch's compiler costs
    (torch.use_deterministic_algorithms imports it)."""
    assert modules_loaded_by("ac.seed_everything(0)", "torch._inductor", "torch._dynamo") == [False, False]


def test_importing_the_course_leaves_matplotlib_unloaded_until_a_plot_is_drawn():
    """Graded exercises import the course but draw nothing; they should not pay for matplotlib's start-up."""
    assert modules_loaded_by("pass", "matplotlib.pyplot") == [False]
    assert modules_loaded_by("ac.use_course_style()", "matplotlib.pyplot") == [True]


def test_seed_everything_returns_a_seeded_generator():
    a = torch.rand(3, generator=ac.seed_everything(7))
    b = torch.rand(3, generator=ac.seed_everything(7))
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("bad", [1.5, "0", None, True])
def test_seed_everything_rejects_non_integers(bad):
    with pytest.raises(TypeError, match="seed must be an int"):
        ac.seed_everything(bad)


def test_get_device_follows_the_environment_override(monkeypatch):
    monkeypatch.setenv("ATTENTION_COURSE_DEVICE", "cpu")
    assert ac.get_device() == torch.device("cpu")
    monkeypatch.setenv("ATTENTION_COURSE_DEVICE", "tpu")
    with pytest.raises(ValueError, match="'tpu'"):
        ac.get_device()


def test_get_device_refuses_cuda_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="cuda"):
        ac.get_device("cuda")
    monkeypatch.delenv("ATTENTION_COURSE_DEVICE", raising=False)
    assert ac.get_device() == torch.device("cpu")


def test_workload_picks_by_device():
    assert ac.workload(cpu=10, gpu=100, device=torch.device("cpu")) == 10
    assert ac.workload(cpu=10, gpu=100, device=torch.device("cuda")) == 100


def test_show_renders_the_source_as_highlighted_html_and_text():
    shown = ac.show(ac.workload)
    html = shown._repr_html_()
    assert "def" in html and "workload" in html and "<span" in html
    assert repr(shown).startswith("# attention_course.runtime.workload")
    assert "return gpu if on_gpu(device) else cpu" in repr(shown)


def test_show_finds_a_helper_by_its_path_inside_the_package():
    # A lesson shows a helper that is not exported without importing from inside the library.
    shown = repr(ac.show("tiled._tiled_backward"))
    assert shown.startswith("# attention_course.tiled._tiled_backward") and "def _tiled_backward(" in shown
    assert repr(ac.show("runtime.workload")) == repr(ac.show(ac.workload))
    with pytest.raises(ValueError, match="has no module 'nope'"):
        ac.show("nope.workload")
    with pytest.raises(ValueError, match="attention_course.runtime has no 'nope'"):
        ac.show("runtime.nope")
    with pytest.raises(ValueError, match="'module.name'"):
        ac.show("workload")


def test_show_refuses_objects_without_source():
    with pytest.raises(TypeError, match="cannot show the source"):
        ac.show(3)


def test_plot_attention_labels_queries_on_rows_and_keys_on_columns():
    weights = torch.softmax(torch.randn(3, 4), dim=-1)
    ax = ac.plot_attention(weights, ["q0", "q1", "q2"], ["k0", "k1", "k2", "k3"])
    assert [label.get_text() for label in ax.get_yticklabels()] == ["q0", "q1", "q2"]
    assert [label.get_text() for label in ax.get_xticklabels()] == ["k0", "k1", "k2", "k3"]
    assert ax.get_ylabel() == "query" and ax.get_xlabel() == "key"
    assert ax.images[0].get_cmap().name in plotting.SAFE_COLORMAPS
    # Small maps carry their numbers, so the figure reads without colour.
    assert len(ax.texts) == 12 and ax.texts[0].get_text() == f"{weights[0, 0]:.2f}"


def test_plot_attention_slants_long_key_labels_only():
    """Word labels on the columns would overlap, so they are turned 45 degrees; short ones stay level."""
    words = ac.plot_attention(torch.rand(2, 3), None, ["black", "cat", "sleeps"])
    assert {label.get_rotation() for label in words.get_xticklabels()} == {45.0}
    assert {label.get_horizontalalignment() for label in words.get_xticklabels()} == {"right"}
    digits = ac.plot_attention(torch.rand(2, 3), None, ["1", "2", "3"])
    assert {label.get_rotation() for label in digits.get_xticklabels()} == {0.0}


def test_plot_attention_rejects_mismatched_labels_unsafe_maps_and_batches():
    with pytest.raises(ValueError, match=r"got 2 labels for 3 queries \(rows\)"):
        ac.plot_attention(torch.rand(3, 3), ["a", "b"], None)
    with pytest.raises(ValueError, match="colour-blind-safe"):
        ac.plot_attention(torch.rand(3, 3), cmap="jet")
    with pytest.raises(ValueError, match=r"must be 2-D.*\(2, 3, 3\)"):
        ac.plot_attention(torch.rand(2, 3, 3))


def test_every_default_colormap_of_the_helpers_is_colour_blind_safe():
    assert plotting.ATTENTION_CMAP in plotting.SAFE_COLORMAPS
    assert plotting.DIVERGING_CMAP in plotting.SAFE_COLORMAPS
    ac.use_course_style()
    assert matplotlib.rcParams["image.cmap"] in plotting.SAFE_COLORMAPS
    cycle = [entry["color"] for entry in matplotlib.rcParams["axes.prop_cycle"]]
    assert set(cycle) <= set(plotting.OKABE_ITO)


def test_plot_attention_grid_shares_one_colour_scale():
    maps = [torch.softmax(torch.randn(4, 4) * scale, dim=-1) for scale in (0.1, 1.0, 10.0)]
    fig = ac.plot_attention_grid(maps, ["a", "b", "c"], ncols=2)
    visible = [ax for ax in fig.axes if ax.get_visible() and ax.images]
    assert len(visible) == 3
    assert {ax.images[0].get_clim() for ax in visible} == {(0.0, 1.0)}
    with pytest.raises(ValueError, match="same shape"):
        ac.plot_attention_grid([torch.rand(2, 2), torch.rand(3, 3)], ["a", "b"])
    with pytest.raises(ValueError, match="2 titles for 3 maps"):
        ac.plot_attention_grid(maps, ["a", "b"])


def test_show_figure_displays_an_image_with_alt_text(monkeypatch):
    import matplotlib.pyplot as plt
    from IPython import display as ipython_display

    shown = []
    monkeypatch.setattr(ipython_display, "display", lambda obj: shown.append(obj))
    fig, _ = plt.subplots()
    ac.show_figure(fig, alt='a "quoted" description')
    assert len(shown) == 1
    html = shown[0].data
    assert html.startswith('<img alt="a &quot;quoted&quot; description" src="data:image/png;base64,')
    with pytest.raises(ValueError, match="alt text"):
        ac.show_figure(plt.subplots()[0], alt="  ")
