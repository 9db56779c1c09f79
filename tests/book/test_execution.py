"""The book's parallel, cached execution (_ext/course_execution.py), on a small book in a temporary folder.

No built site is needed: these tests run with the library tests' speed (a few kernels start).
"""

from __future__ import annotations

import importlib.util
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
