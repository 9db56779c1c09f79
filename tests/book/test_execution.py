"""The book's parallel, cached execution (_ext/course_execution.py), on a small book in a temporary folder.

No built site is needed: these tests run with the library tests' speed (a few kernels start).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "_ext" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)  # the spawned workers import it by name (_ext is on their sys.path)
    spec.loader.exec_module(module)
    return module


if str(ROOT / "_ext") not in sys.path:
    sys.path.insert(0, str(ROOT / "_ext"))
execution = _load("course_execution")
course_site = _load("course_site")

# About half a second of CPU in the kernel, so that the measured kernel CPU time is told from zero.
BUSY = "total = 0\nfor i in range(3_000_000):\n    total += i\ntotal"


def _write(path: Path, *cells) -> Path:
    notebook = nbformat.v4.new_notebook(cells=list(cells))
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, path)
    return path


@pytest.fixture
def book(tmp_path):
    """A book folder with a package file, two lessons and the cache folder for them."""
    (tmp_path / "src" / "attention_course").mkdir(parents=True)
    (tmp_path / "src" / "attention_course" / "__init__.py").write_text("VERSION = 1\n")
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    first = _write(tmp_path / "chapters" / "01_a.ipynb", md("# A"), code(BUSY), code("import os\nos.environ['OMP_NUM_THREADS']"))
    second = _write(tmp_path / "chapters" / "02_b.ipynb", md("# B"), code("print('b')"))
    return tmp_path, [first, second]


def _run(root: Path, notebooks: list[Path], jobs: int = 2) -> dict[str, list[str]]:
    return execution.execute_book(notebooks, execution.cache_folder(root), jobs=jobs, timeout=60, root=root)


def _record(root: Path, path: Path):
    from jupyter_cache import get_cache

    return execution.cached_record(get_cache(str(execution.cache_folder(root))), nbformat.read(path, as_version=4))


def test_notebooks_run_once_and_rerun_alone_when_their_code_changes(book):
    root, (first, second) = book
    result = _run(root, [first, second])
    assert sorted(result["executed"]) == ["chapters/01_a.ipynb", "chapters/02_b.ipynb"] and not result["failed"]
    assert _record(root, first) is not None and _record(root, second) is not None

    record = _record(root, first)
    assert record.data[execution.CPU_KEY] >= 0.2, f"the busy cell's CPU time was not measured: {record.data}"
    assert record.data[execution.WALL_KEY] > 0
    # the machine's speed when it ran, the yardstick of the budgets (_ext/cpu_calibration.py)
    assert 0 < record.data[execution.CALIBRATION_KEY] < 60, record.data
    from jupyter_cache import get_cache

    cached = get_cache(str(execution.cache_folder(root))).get_cache_bundle(record.pk).nb
    outputs = [output for cell in cached.cells for output in cell.get("outputs", [])]
    assert any("'1'" in str(output) for output in outputs), "the kernel did not run on one thread"

    assert _run(root, [first, second]) == {"executed": [], "failed": []}, "an unchanged book executed again"

    notebook = nbformat.read(second, as_version=4)
    notebook.cells[0].source = "# B, reworded"
    nbformat.write(notebook, second)
    assert _run(root, [first, second]) == {"executed": [], "failed": []}, "edited prose re-executed a notebook"

    notebook.cells[1].source = "print('b, changed')"
    nbformat.write(notebook, second)
    assert _run(root, [first, second]) == {"executed": ["chapters/02_b.ipynb"], "failed": []}


def test_a_changed_library_uses_a_new_cache_and_old_ones_are_pruned(book):
    root, _ = book
    before = execution.cache_folder(root)
    (root / "src" / "attention_course" / "__init__.py").write_text("VERSION = 2\n")
    after = execution.cache_folder(root)
    assert after != before and after.parent == before.parent

    folders = [before.parent / f"{execution.CACHE_PREFIX}{index}" for index in range(5)]
    for folder in folders:
        folder.mkdir(parents=True)
    (before.parent / "not-ours").mkdir()
    removed = execution.prune_caches(after, keep=3)
    left = sorted(path.name for path in before.parent.iterdir())
    assert len(removed) == 3 and len([name for name in left if name.startswith(execution.CACHE_PREFIX)]) == 2
    assert "not-ours" in left, "a folder the course did not create was removed"


def test_a_failing_cell_fails_the_run_and_is_not_cached(book, capsys):
    root, (first, _) = book
    broken = _write(root / "chapters" / "03_c.ipynb", nbformat.v4.new_code_cell("assert 1 + 1 == 3, 'arithmetic'"))
    result = _run(root, [first, broken])
    assert result == {"executed": ["chapters/01_a.ipynb"], "failed": ["chapters/03_c.ipynb"]}
    assert _record(root, broken) is None
    assert "AssertionError" in capsys.readouterr().err


def test_the_book_lists_its_notebooks_from_the_table_of_contents():
    notebooks = execution.book_notebooks(ROOT)
    names = [path.relative_to(ROOT).as_posix() for path in notebooks]
    assert "chapters/01_why_attention.ipynb" in names
    assert any(name.startswith("exercises/solutions/") for name in names)
    assert all(path.suffix == ".ipynb" and path.exists() for path in notebooks)
    assert execution.cell_timeout(ROOT) > 0


def test_module_index_togglers_get_alt_text_naming_their_module():
    html = (
        '<tr><td><img src="_static/minus.png" class="toggler"\n              id="toggle-1" style="display: none" '
        'alt="-" /></td>\n<td>\n<a href="api.html#module-attention_course"><code class="xref">attention_course'
        '</code></a></td></tr>'
    )
    fixed = course_site.describe_index_togglers(html)
    assert 'alt="-"' not in fixed
    assert 'alt="Collapse or expand the submodules of attention_course"' in fixed
    assert course_site.describe_index_togglers(fixed) == fixed


# --- kernels forked from the zygote (_ext/kernel_zygote.py) ------------------------------------------------------

PROBE = """import os, sys
import torch
print("cwd", os.path.basename(os.getcwd()))
print("_ext on sys.path", any(os.path.basename(p.rstrip(os.sep)) == "_ext" for p in sys.path))
print("threads", os.environ["OMP_NUM_THREADS"], torch.get_num_threads())
print("hash seed", os.environ.get("PYTHONHASHSEED"), hash("attention"))
print("parent", os.environ.get("JPY_PARENT_PID") == str(os.getppid()))
print("main", __name__)"""


def _outputs(root: Path, path: Path) -> list[str]:
    from jupyter_cache import get_cache

    record = _record(root, path)
    assert record is not None, f"{path.name} was not cached"
    cached = get_cache(str(execution.cache_folder(root))).get_cache_bundle(record.pk).nb
    return ["".join(output.get("text", "")) for cell in cached.cells for output in cell.get("outputs", [])]


def test_a_forked_kernel_starts_as_a_fresh_one_would(tmp_path):
    """Same folder, sys.path, threads, hash seed, parent and __main__ as a kernel that nbclient starts."""
    seen = {}
    for preloaded in (True, False):
        root = tmp_path / str(preloaded)
        (root / "src" / "attention_course").mkdir(parents=True)
        probe = _write(root / "chapters" / "01_probe.ipynb", nbformat.v4.new_code_cell(PROBE))
        result = execution.execute_book(
            [probe], execution.cache_folder(root), jobs=1, timeout=60, root=root, preloaded_kernels=preloaded
        )
        assert result == {"executed": ["chapters/01_probe.ipynb"], "failed": []}
        seen[preloaded] = _outputs(root, probe)
        # the machine's speed, measured in a child of the zygote or, with fresh kernels, in a process of its own
        calibration = _record(root, probe).data[execution.CALIBRATION_KEY]
        assert 0 < calibration < 60, f"no calibration with preloaded_kernels={preloaded}: {calibration}"
    assert seen[True] == seen[False], f"forked: {seen[True]}\nfresh: {seen[False]}"
    text = seen[True][0]
    for line in ("cwd chapters", "_ext on sys.path False", "threads 1 1",
                 "parent True", "main __main__"):
        assert line in text, f"{line!r} not in the probe's output:\n{text}"


def test_the_zygote_start_up_is_charged_to_one_notebook_once(tmp_path):
    """Its import of PyTorch (over a second of CPU) is counted in the first notebook's time, not in later ones."""
    (tmp_path / "src" / "attention_course").mkdir(parents=True)
    notebooks = [
        _write(tmp_path / "chapters" / f"0{index}_n.ipynb", nbformat.v4.new_code_cell(f"{index} + 1")) for index in (1, 2, 3)
    ]
    assert _run(tmp_path, notebooks, jobs=1)["failed"] == []
    cpu = sorted(_record(tmp_path, path).data[execution.CPU_KEY] for path in notebooks)
    assert cpu[-1] >= 1.0, f"the start-up's CPU time is missing: {cpu}"
    assert cpu[1] < cpu[-1] / 2, f"the start-up was charged more than once: {cpu}"


def test_a_kernel_that_dies_fails_its_notebook_and_the_next_one_runs(tmp_path, capsys):
    (tmp_path / "src" / "attention_course").mkdir(parents=True)
    dies = _write(tmp_path / "chapters" / "01_dies.ipynb", nbformat.v4.new_code_cell("import os\nos._exit(3)"))
    after = _write(tmp_path / "chapters" / "02_after.ipynb", nbformat.v4.new_code_cell("print('still here')"))
    result = _run(tmp_path, [dies, after], jobs=1)
    assert result == {"executed": ["chapters/02_after.ipynb"], "failed": ["chapters/01_dies.ipynb"]}
    assert "DeadKernelError" in capsys.readouterr().err
    assert "still here" in _outputs(tmp_path, after)[0]


def test_a_stopped_worker_takes_its_zygote_and_kernel_with_it(tmp_path):
    """Ending the worker (make book interrupted) ends its zygote and a kernel still running a cell."""
    import signal
    import subprocess
    import time

    started, notebook_path = tmp_path / "kernel.pid", tmp_path / "sleeps.ipynb"
    sleeps = f"import os, time\nopen({str(started)!r}, 'w').write(str(os.getpid()))\ntime.sleep(300)"
    _write(notebook_path, nbformat.v4.new_code_cell(sleeps))
    script = (
        f"import sys; sys.path.insert(0, {str(ROOT / '_ext')!r})\n"
        "import course_execution as execution\n"
        "execution.start_worker(True)\n"
        "print(execution._zygote.process.pid, flush=True)\n"
        f"execution.execute_notebook({str(notebook_path)!r}, 600)\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    zygote = int(worker.stdout.readline())
    # No deadline: however busy the machine, the cell runs or the worker ends (its cell timeout is 600 s).
    while not (started.exists() and started.read_text()):
        assert worker.poll() is None, "the kernel never ran its cell"
        time.sleep(0.2)
    kernel = int(started.read_text())
    worker.send_signal(signal.SIGKILL)
    worker.wait()

    def gone(pid: int) -> bool:  # exited: no such process, or a zombie that nobody has reaped yet
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        return state in ("Z", "X")

    # They end on their worker's death (a signal, not a race); the deadline only stops a test that would hang.
    deadline = time.monotonic() + 120
    while not (gone(kernel) and gone(zygote)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert gone(kernel), "the kernel outlived its worker"
    assert gone(zygote), "the zygote outlived its worker"


def test_a_zygote_that_dies_fails_one_notebook_and_the_rest_run_in_fresh_kernels(tmp_path, monkeypatch):
    for name in execution.KERNEL_ENV:  # set in this process by the worker's start: restored afterwards
        monkeypatch.setenv(name, os.environ.get(name, ""))
    (tmp_path / "src" / "attention_course").mkdir(parents=True)
    first = _write(tmp_path / "chapters" / "01_a.ipynb", nbformat.v4.new_code_cell("print('a')"))
    second = _write(tmp_path / "chapters" / "02_b.ipynb", nbformat.v4.new_code_cell("print('b')"))
    execution.start_worker(True)
    try:
        execution._zygote.process.kill()
        execution._zygote.process.wait()
        lost = execution.execute_notebook(str(first), 60)
        assert lost["error"] and "zygote exited" in lost["error"] and lost["notebook"] is None
        assert execution._zygote is None, "the dead zygote was asked again"
        fresh = execution.execute_notebook(str(second), 60)
        assert fresh["error"] is None
        outputs = nbformat.reads(fresh["notebook"], as_version=4).cells[0].outputs
        assert [output.get("text") for output in outputs] == ["b\n"]
    finally:
        execution._zygote = None
