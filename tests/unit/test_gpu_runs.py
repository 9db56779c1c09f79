"""GPU runs: what `make gpu-check` records (tests/notebooks/gpu_check.py) and what the Runtimes page shows of it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from tests.notebooks import gpu_check

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("course_site", ROOT / "_ext" / "course_site.py")
course_site = importlib.util.module_from_spec(spec)
spec.loader.exec_module(course_site)


def result(name, wall, failures=(), stopped=None):
    return {"notebook": f"chapters/{name}.ipynb", "wall_s": wall, "kernel_cpu_s": 3.0, "slowest_cells": [],
            "stopped": stopped, "failures": list(failures)}


def test_a_recorded_gpu_run_appears_with_the_gpu_name_and_date(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "RECORD", tmp_path / "gpu_runs.json")
    failing = {"cell": 25, "line": "assert x", "claims": [], "message": "AssertionError: "}
    results = [result("01_why_attention", 41.6, [failing]), result("02_hard", 9.2),
               result("07_positional", None, stopped={"cell": 27, "seconds": 300, "first_line": "def"})]
    gpu_check.record(results[:2], "NVIDIA H100 80GB HBM3 (compute capability 9.0)", jobs=8, threads=2)
    gpu_check.record(results, "Tesla T4 (compute capability 7.5)", jobs=4, threads=1)
    runs = json.loads((tmp_path / "gpu_runs.json").read_text())
    assert [run["device"].split()[0] for run in runs] == ["NVIDIA", "Tesla"]  # appended, never replaced
    caption, rows = course_site.gpu_run_table(runs)
    assert caption.startswith(f"Measured on Tesla T4 (compute capability 7.5) on {runs[-1]['date']}")
    assert "4 notebooks at once, 1 CPU threads each" in caption
    assert rows == [("01_why_attention", "42", "failed"), ("02_hard", "9", "passed"),
                    ("07_positional", "-", "failed")]


def test_without_a_recorded_run_the_page_shows_no_gpu_time():
    assert course_site.gpu_run_table([]) is None
    assert not (ROOT / course_site.GPU_RUNS).exists() or json.loads((ROOT / course_site.GPU_RUNS).read_text())


def test_kernels_run_as_on_colab_with_gpu_sizes_forced_only_without_cuda(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_COURSE_DEVICE", "cpu")
    monkeypatch.setenv("ATTENTION_COURSE_STATIC_FIGURES", "1")
    emulated = gpu_check.kernel_environment(False, 3, tmp_path)
    assert "ATTENTION_COURSE_DEVICE" not in emulated and "ATTENTION_COURSE_STATIC_FIGURES" not in emulated
    assert emulated["ATTENTION_COURSE_WORKLOAD"] == "gpu" and emulated["OMP_NUM_THREADS"] == "3"
    on_cuda = gpu_check.kernel_environment(True, 2, tmp_path)
    assert "ATTENTION_COURSE_WORKLOAD" not in on_cuda and on_cuda["OMP_NUM_THREADS"] == "2"
    assert on_cuda["JUPYTER_PATH"].split(":")[0] == str(tmp_path)
    gpu_check.write_kernel_spec(tmp_path)
    spec = json.loads((tmp_path / "kernels" / "python3" / "kernel.json").read_text())
    assert spec["argv"][:3] == [gpu_check.sys.executable, "-m", "ipykernel_launcher"]


def test_a_notebook_run_names_failing_claims_and_stops_a_slow_cell(tmp_path):
    import io

    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in [
        "x = 1",
        "# Claim: x is two\nassert x == 2, 'x is not two'",
        "import time\ntime.sleep(60)",
        "print('never reached')",
    ]]
    path = tmp_path / "claims.ipynb"
    nbformat.write(notebook, path)
    log = io.StringIO()
    found = gpu_check.run_notebook(path, cell_limit=5, log=log)
    assert found["failures"] == [{"cell": 1, "line": "----> 2 assert x == 2, 'x is not two'", "claims": ["x is two"],
                                  "message": "AssertionError: x is not two"}]
    assert found["stopped"] == {"cell": 2, "seconds": 5, "first_line": "import time"}
    assert "cell   2 STOPPED after 5 s" in log.getvalue() and "cell   0 " in log.getvalue()
    line = gpu_check.summary_line(found)
    assert line.startswith(f"{path}: STOPPED in cell 2")


def test_the_startup_file_hides_bubblewrap_as_on_colab(tmp_path, monkeypatch):
    from attention_course.grading import isolation

    monkeypatch.setattr(isolation, "bwrap_path", isolation.bwrap_path)  # restored after the test
    gpu_check.write_ipython_startup(tmp_path)
    startup = (tmp_path / "profile_default" / "startup" / "00-no-bwrap.py").read_text()
    exec(compile(startup, "00-no-bwrap.py", "exec"), {})
    assert isolation.bwrap_path() is None
    env = gpu_check.kernel_environment(False, 1, tmp_path, tmp_path)
    assert env["IPYTHONDIR"] == str(tmp_path)
    monkeypatch.delenv("IPYTHONDIR", raising=False)
    assert "IPYTHONDIR" not in gpu_check.kernel_environment(False, 1, tmp_path)  # --with-bwrap


def test_the_runtimes_page_directive_renders_the_latest_run_or_says_there_is_none(tmp_path):
    from types import SimpleNamespace

    directive_class = course_site.gpu_table_directive()
    env = SimpleNamespace(srcdir=str(tmp_path), note_dependency=lambda path: None)
    state = SimpleNamespace(document=SimpleNamespace(settings=SimpleNamespace(env=env)))
    directive = directive_class.__new__(directive_class)
    directive.state = state
    (note,) = directive.run()
    assert note.astext().startswith("No GPU run has been recorded yet")
    record = tmp_path / course_site.GPU_RUNS
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps([{"date": "2026-11-26", "device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0",
                                   "parallel_notebooks": 8, "threads_per_kernel": 2,
                                   "notebooks": {"01_why_attention": {"wall_s": 41.2, "passed": True}}}]))
    caption, table = directive.run()
    assert caption.astext().startswith("Measured on NVIDIA H100 80GB HBM3 on 2026-11-26")
    cells = [entry.astext() for entry in table.findall(course_site.nodes.entry)]
    assert cells == ["Notebook", "Wall on the GPU (s)", "Claims", "01_why_attention", "41", "passed"]
