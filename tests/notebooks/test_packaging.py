"""The package installs on Colab without replacing Colab's packages, and its widgets run on ipywidgets 7 and 8."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from importlib.metadata import requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.notebooks.notebook_files import LESSONS, ROOT, read, relative

COLAB = json.loads((ROOT / "tests" / "data" / "colab_versions.json").read_text())
# ipywidgets 7.7.1 is what Colab ships; these are the versions of its own dependencies that go with it.
IPYWIDGETS_7 = [
    "ipywidgets==7.7.1",
    "widgetsnbextension==3.6.6",
    "jupyterlab-widgets==1.1.7",
    "ipython-genutils==0.2.0",
]


def declared_dependencies() -> list[Requirement]:
    return [Requirement(line) for line in requires("attention-course") or []]


def test_package_declares_dependencies():
    names = {requirement.name for requirement in declared_dependencies()}
    assert {"torch", "numpy", "ipywidgets"} <= names, names


@pytest.mark.parametrize("requirement", declared_dependencies(), ids=str)
def test_colab_preinstalled_version_satisfies_the_dependency(requirement):
    installed = COLAB["packages"].get(requirement.name)
    if installed is None:
        # Not on Colab: pip adds it, which replaces nothing. It must not pull in torch under another name.
        assert requirement.name not in {"torch-cpu", "torch-nightly"}
        return
    assert requirement.specifier.contains(installed, prereleases=True), (
        f"{requirement} would make pip replace Colab's {requirement.name} {installed}: use a lower bound only"
    )
    assert all(spec.operator in (">=", ">", "!=") for spec in requirement.specifier), (
        f"{requirement}: the package declares lower bounds only, so Colab keeps its own versions"
    )


def test_package_supports_colab_python(root):
    text = (root / "pyproject.toml").read_text()
    assert 'requires-python = ">=3.10"' in text
    assert Version(COLAB["python"]) >= Version("3.10")


def lessons_with_interactive_figures() -> list[str]:
    return [
        relative(path)
        for path in LESSONS
        if any(cell.cell_type == "code" and "interactive_figure(" in cell.source for cell in read(path).cells)
    ]


# In a live kernel (Colab ships ipywidgets 7.7.1; a local Jupyter has 8), ac.interactive_figure builds one
# ipywidgets control per course control and redraws when any of them changes. The script builds a figure with
# every kind of control, moves each control, and reports what draw() and the alt text received.
CHECK_SCRIPT = textwrap.dedent(
    """
    import json, os
    os.environ.pop("ATTENTION_COURSE_STATIC_FIGURES", None)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import ipywidgets as widgets
    import IPython.display
    from IPython.core.interactiveshell import InteractiveShell
    InteractiveShell.instance()
    print("ipywidgets", widgets.__version__)
    import attention_course as ac
    from attention_course import interactive

    shown, drawn, described = [], [], []
    IPython.display.display = lambda *objects, **kwargs: shown.extend(objects)

    def draw(beta, score, causal, review):
        drawn.append([beta, score, causal, review])
        figure, axis = plt.subplots(figsize=(2, 2))
        axis.set_title(f"{beta} {score} {causal} {review}")
        return figure

    def alt(beta, score, causal, review):
        described.append([beta, score, causal, review])
        return f"beta {beta}, score {score}, causal {causal}, review {review}"

    ac.interactive_figure(
        draw, alt,
        beta=ac.Slider([0.5, 1, 2], label="beta", value=1),
        score=ac.Choice({"dot product": "dot", "additive": "add"}, label="score"),
        causal=ac.Toggle(label="causal", value=False),
        review=ac.Text(["a fine film", "not good"], label="review"),
    )
    boxes = [item for item in shown if isinstance(item, widgets.VBox)]
    controls = list(boxes[0].children[0].children) if boxes else []
    kinds = [type(control).__name__ for control in controls]
    first = len(drawn)
    if len(controls) == 4:
        controls[0].value = 2
        controls[1].value = "add"
        controls[2].value = True
        controls[3].value = "a dull film"
    print(json.dumps({"kinds": kinds, "initial": drawn[:first], "after": drawn[first:], "alt": described[-1:]}))
    """
)


def run_live_figure(python_path: str | None) -> dict:
    import os

    env = {**os.environ, "MPLBACKEND": "Agg"}
    if python_path:
        env["PYTHONPATH"] = python_path
    result = subprocess.run(
        [sys.executable, "-c", CHECK_SCRIPT], capture_output=True, text=True, env=env, timeout=180
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    return json.loads(lines[-1]) | {"version_line": lines[0]}


def assert_live_figure_responds(outcome: dict) -> None:
    assert outcome["kinds"] == ["SelectionSlider", "Dropdown", "Checkbox", "Text"], outcome
    assert outcome["initial"] == [[1, "dot", False, "a fine film"]], outcome
    # Every control redraws, with the value it now shows, and the alt text follows the last frame.
    assert outcome["after"][-1] == [2, "add", True, "a dull film"], outcome
    assert len(outcome["after"]) == 4, outcome
    assert outcome["alt"] == [outcome["after"][-1]], outcome


@pytest.fixture(scope="module")
def ipywidgets7(tmp_path_factory) -> str:
    target = ROOT / "_build" / "ipywidgets7"
    if not (target / "ipywidgets" / "__init__.py").exists():
        download = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), *IPYWIDGETS_7],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert download.returncode == 0, f"could not install ipywidgets 7 for the test: {download.stderr[-2000:]}"
    return str(target)


def test_lessons_use_interactive_figures():
    assert len(lessons_with_interactive_figures()) >= 5, (
        "fewer than five lessons have an interactive figure: the live-widget tests below would check little"
    )


def test_interactive_figure_responds_on_ipywidgets_8():
    outcome = run_live_figure(None)
    assert outcome["version_line"].startswith("ipywidgets 8"), outcome["version_line"]
    assert_live_figure_responds(outcome)


def test_interactive_figure_responds_on_colabs_ipywidgets_7(ipywidgets7):
    outcome = run_live_figure(ipywidgets7)
    assert outcome["version_line"] == "ipywidgets 7.7.1", outcome["version_line"]
    assert_live_figure_responds(outcome)


def test_library_imports_without_widgets():
    """The library itself never needs ipywidgets at import time (graders run it headless)."""
    code = "import sys; sys.modules['ipywidgets'] = None; import attention_course; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def test_colab_record_is_current():
    assert Path(ROOT / "tests" / "data" / "colab_versions.json").exists()
