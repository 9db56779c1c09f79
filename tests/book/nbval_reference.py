"""The notebooks the book build executed, with their outputs, for nbval to re-execute and compare.

    python -m tests.book.nbval_reference [FOLDER]           # write them (default folder: _build/nbval)
    python -m tests.book.nbval_reference --run [FOLDER]     # write them, then run nbval on them (make test)

`make book` executes every lesson and exercise solution once, into a jupyter-cache folder
(``_ext/course_execution.py``); the committed notebooks carry no outputs. This writes each notebook of
``_toc.yml`` with the outputs of its cache record to ``FOLDER/<same path>.ipynb``, so that
``pytest --nbval FOLDER`` (``make test``) runs it again in a fresh kernel, with the book's kernel environment,
and compares every cell's output with the book's (after the rules of ``tests/nbval_sanitize.cfg``; the cells
whose whole output is a measurement, which that file names, run without their output compared): the check
that what a page prints is what its code computes, reproducibly, on the machine that built it.

nbval has no mode that compares outputs without executing (each cell is run in its kernel and its output
compared), so this is the book's second execution: it costs the book's kernel CPU time again (about 350 s,
plus 3 s of kernel start per notebook; see ``_build/html/cpu-times.json``), on two workers.

A notebook whose code cells differ from every cache record (edited since the book was built) is an error:
run `make book` first.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_FOLDER = ROOT / "_build" / "nbval"
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"


def _course_execution():
    spec = importlib.util.spec_from_file_location("course_execution", ROOT / "_ext" / "course_execution.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


IGNORE_OUTPUT_TAG = "nbval-ignore-output"  # nbval's cell tag: run the cell, do not compare its output


def measured_cells(text: str | None = None) -> dict[str, list[str]]:
    """notebook -> texts that name its measured cells (the ``measured-output:`` lines of :data:`SANITIZE`)."""
    found: dict[str, list[str]] = {}
    for line in (SANITIZE.read_text(encoding="utf-8") if text is None else text).splitlines():
        if line.startswith("measured-output:"):
            notebook, _, snippet = line.removeprefix("measured-output:").strip().partition(" :: ")
            found.setdefault(notebook.strip(), []).append(snippet)
    return found


def tag_measured_cells(notebook: nbformat.NotebookNode, snippets: list[str], name: str) -> None:
    """Tag the one code cell each snippet names ``nbval-ignore-output``; raise when a snippet names none or
    several (the rule went stale)."""
    for snippet in snippets:
        cells = [cell for cell in notebook.cells if cell.cell_type == "code" and snippet in cell.source]
        if len(cells) != 1:
            raise SystemExit(f"tests/nbval_sanitize.cfg: {snippet!r} occurs in {len(cells)} code cells of {name}, "
                             "not one: update its measured-output line")
        tags = cells[0].metadata.setdefault("tags", [])
        if IGNORE_OUTPUT_TAG not in tags:
            tags.append(IGNORE_OUTPUT_TAG)


def write_references(folder: Path = DEFAULT_FOLDER, root: Path = ROOT, cache_path: Path | None = None,
                     only: list[str] | None = None) -> list[Path]:
    """Write every book notebook (or those whose path contains one of ``only``) with its outputs from the
    current cache folder (or ``cache_path``) under ``folder``; return the paths written."""
    from jupyter_cache import get_cache

    execution = _course_execution()
    cache_path = cache_path or execution.cache_folder(root)
    if not (cache_path / "global.db").exists():
        raise SystemExit(f"{cache_path} does not exist: run `make book` first (it executes the notebooks)")
    cache = get_cache(str(cache_path))
    shutil.rmtree(folder, ignore_errors=True)
    written, stale = [], []
    measured = measured_cells()
    for source in execution.book_notebooks(root):
        if only and not any(word in source.as_posix() for word in only):
            continue
        notebook = nbformat.read(source, as_version=4)
        try:
            _, merged = cache.merge_match_into_notebook(notebook)
        except KeyError:
            stale.append(source.relative_to(root).as_posix())
            continue
        name = source.relative_to(root).as_posix()
        tag_measured_cells(merged, measured.get(name, []), name)
        target = folder / source.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(merged, target)
        written.append(target)
    if stale:
        raise SystemExit(f"no executed version of {stale} in {cache_path}: run `make book` first")
    return written


def longest_first(paths: list[Path], folder: Path, root: Path = ROOT) -> list[Path]:
    """``paths`` by the kernel CPU time the book build measured, longest first (so that two workers finish
    together rather than one starting the longest notebook last)."""
    measured = root / "_build" / "html" / "cpu-times.json"
    times = json.loads(measured.read_text()) if measured.exists() else {}

    def cost(path: Path) -> float:
        return float(times.get(path.relative_to(folder).with_suffix("").as_posix(), {}).get("cpu_s", 0.0))

    return sorted(paths, key=lambda path: (-cost(path), path.as_posix()))


def run_nbval(paths: list[Path], workers: int = 2, extra: list[str] = ()) -> int:
    """nbval on ``paths`` in kernels with the book's environment (``KERNEL_ENV`` of _ext/course_execution.py):
    every output compared after the rules of :data:`SANITIZE`; the notebooks of one file stay on one worker."""
    # Under the repository (pytest's rootdir), each cell's test id names its notebook; elsewhere the ids of
    # different notebooks' cells coincide ("::Cell 3") and pytest-xdist runs only one of each.
    outside = [path for path in paths if not path.resolve().is_relative_to(ROOT)]
    if outside:
        raise ValueError(f"nbval runs on notebooks inside {ROOT}, not {outside[:3]}")
    env = {**os.environ, **_course_execution().KERNEL_ENV}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval", "--nbval-current-env",
               "--nbval-sanitize-with", str(SANITIZE), "--durations=10",
               *(["-n", str(workers), "--dist", "loadfile"] if workers > 1 else ["-n", "0"]),
               *extra, *map(str, paths)]
    return subprocess.run(command, cwd=ROOT, env=env).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, default=DEFAULT_FOLDER)
    parser.add_argument("--cache", type=Path, help="jupyter-cache folder (default: the current library's)")
    parser.add_argument("--only", nargs="+", help="only the notebooks whose path contains one of these")
    parser.add_argument("--run", action="store_true", help="then run nbval on them")
    parser.add_argument("--workers", type=int, default=2, help="nbval workers (default 2)")
    args = parser.parse_args(argv)
    folder = args.folder.resolve()
    written = write_references(folder, cache_path=args.cache, only=args.only)
    print(f"nbval_reference: {len(written)} executed notebooks in {args.folder}", flush=True)
    return run_nbval(longest_first(written, folder), args.workers) if args.run else 0


if __name__ == "__main__":
    sys.exit(main())
