"""The package installs on Colab without replacing Colab's packages, and its widgets run on ipywidgets 7 and 8."""

from __future__ import annotations

import ast
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


def widget_calls(source: str) -> list[str]:
    """The ``widgets.<Name>(...)`` calls in a cell, as source, with callbacks replaced by a stub."""
    calls = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "widgets"
        ):
            if node.func.attr in {"interact", "interactive", "interact_manual"} and node.args:
                node.args[0] = ast.Name(id="_callback", ctx=ast.Load())
            calls.append(ast.unparse(node))
    return calls


def lesson_widget_cells() -> list[tuple[str, str]]:
    cells = []
    for path in LESSONS:
        for cell in read(path).cells:
            if cell.cell_type == "code" and "widgets." in cell.source:
                cells.append((relative(path), cell.source))
    return cells


CHECK_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import ipywidgets as widgets
    from IPython.core.interactiveshell import InteractiveShell
    InteractiveShell.instance()  # interact() displays through the shell
    print("ipywidgets", widgets.__version__)
    def _callback(**kwargs):
        return None
    failures = []
    checked = 0
    for where, call, namespace_source in json.load(sys.stdin):
        namespace = {"widgets": widgets, "_callback": _callback}
        try:
            exec(namespace_source, namespace)   # the cell's plain assignments of widgets, for names used in calls
            eval(call, namespace)
            checked += 1
        except NameError as error:
            print(f"not checkable in isolation ({error}): {where}: {call}")
        except Exception as error:
            failures.append(f"{where}: {call}: {type(error).__name__}: {error}")
    print(json.dumps({"checked": checked, "failures": failures}))
    """
)


def assignments_of_widgets(source: str) -> str:
    tree = ast.parse(source)
    kept = [
        node
        for node in tree.body
        if isinstance(node, ast.Assign)
        and "widgets." in ast.unparse(node.value)
        and "interact" not in ast.unparse(node.value)
    ]
    return "\n".join(ast.unparse(node) for node in kept)


def run_widget_calls(python_path: str | None) -> dict:
    payload = [
        (where, call, assignments_of_widgets(source))
        for where, source in lesson_widget_cells()
        for call in widget_calls(source)
    ]
    env = {"PYTHONPATH": python_path} if python_path else {}
    import os

    result = subprocess.run(
        [sys.executable, "-c", CHECK_SCRIPT],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    print(result.stdout)
    return json.loads(result.stdout.strip().splitlines()[-1]) | {"version_line": result.stdout.splitlines()[0]}


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


def test_lessons_use_widgets():
    assert lesson_widget_cells(), "no lesson has a widget: the widget compatibility tests below would check nothing"


def test_widget_code_runs_on_ipywidgets_8():
    outcome = run_widget_calls(None)
    assert outcome["version_line"].startswith("ipywidgets 8"), outcome["version_line"]
    assert outcome["checked"] > 0 and not outcome["failures"], outcome


def test_widget_code_runs_on_ipywidgets_7(ipywidgets7):
    outcome = run_widget_calls(ipywidgets7)
    assert outcome["version_line"] == "ipywidgets 7.7.1", outcome["version_line"]
    assert outcome["checked"] > 0 and not outcome["failures"], outcome


def test_library_imports_without_widgets():
    """The library itself never needs ipywidgets at import time (graders run it headless)."""
    code = "import sys; sys.modules['ipywidgets'] = None; import attention_course; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def test_colab_record_is_current():
    assert Path(ROOT / "tests" / "data" / "colab_versions.json").exists()
