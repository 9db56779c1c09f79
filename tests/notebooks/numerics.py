"""Do the lessons' claims hold on another processor? Re-run them under other floating-point rounding.

A lesson that trains a model asserts what the trained model does. Float32 arithmetic rounds differently on
different processors (AVX2 or AVX-512 kernels, how MKL blocks a matrix product, how many threads split a
sum), and a training run, chaotic as it is, amplifies a difference of one rounding into different weights.
A claim that holds only for the weights one machine happens to train breaks on the next machine, in CI or
in a learner's Colab runtime. The course met exactly that: an exact tie in chapter 02 that one CPU's
matrix product kept and another's broke, and statements about single heads and single runs.

This tool executes lessons in a fresh kernel under variants of the numerics that a different machine
would bring, and lists every cell that fails, with the claim it guards:

    python -m tests.notebooks.numerics                          # every lesson, every variant
    python -m tests.notebooks.numerics chapters/01_why_attention.ipynb --variant "one thread"

It takes a few minutes per variant on two cores, so it is a tool for authors (``make numerics``), not
part of ``make test``. A claim that fails under some variant must be restated so that it holds on any
processor: a margin instead of an exact value, a property of every head instead of a fact about one.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from tests.notebooks.claims import CLAIM
from tests.notebooks.notebook_files import LESSONS, ROOT, relative

# Each variant changes how float32 sums are rounded, the way another processor would.
VARIANTS: dict[str, dict[str, str]] = {
    "AVX2 kernels": {"ATEN_CPU_CAPABILITY": "avx2"},         # PyTorch's own kernels at AVX2 width
    "MKL compatible path": {"MKL_CBWR": "COMPATIBLE"},      # MKL's matrix products without AVX
    "one thread": {"OMP_NUM_THREADS": "1"},                  # reductions split over one thread, not two
}
ANSI = re.compile(r"\x1b\[[0-9;]*m")
FAILING_LINE = re.compile(r"^\s*-+>\s*\d+ ")  # IPython marks the line that raised: "---> 14 assert ..."


def failures(path: Path) -> list[str]:
    """Execute ``path`` in a fresh kernel (this process's environment) and describe every failing cell."""
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=600, allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    found = []
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") != "error":
                continue
            trace = ANSI.sub("", "\n".join(output.get("traceback", [])))
            line = next((row.strip() for row in trace.splitlines() if FAILING_LINE.match(row)),
                        f"{output['ename']}: {output['evalue']}")
            claims = [match["text"] for match in map(CLAIM.match, cell.source.splitlines()) if match]
            guarded = f" (claims in the cell: {'; '.join(claims)})" if claims else ""
            found.append(f"cell {index}: {line}{guarded}")
    return found


def run_variant(name: str, notebooks: list[Path]) -> int:
    """Run the notebooks in a child process whose environment is the variant's; return its exit code."""
    # The variants are CPU roundings: lessons run on the CPU, as in the book build, even on a GPU machine.
    env = {**os.environ, "ATTENTION_COURSE_DEVICE": "cpu", "ATTENTION_COURSE_STATIC_FIGURES": "1", **VARIANTS[name]}
    command = [sys.executable, "-m", "tests.notebooks.numerics", "--child", *map(str, notebooks)]
    print(f"== {name}: {' '.join(f'{k}={v}' for k, v in VARIANTS[name].items())}", flush=True)
    return subprocess.call(command, env=env, cwd=ROOT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="lessons to run (default: every lesson)")
    parser.add_argument("--variant", action="append", choices=list(VARIANTS),
                        help="a variant to run (repeatable; default: all)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    notebooks = [path.resolve() for path in args.notebooks] or LESSONS
    missing = [str(path) for path in notebooks if not path.is_file()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}")
    if args.child:
        failed = 0
        for path in notebooks:
            start = time.perf_counter()
            found = failures(path)
            name = relative(path) if path.is_relative_to(ROOT) else str(path)
            print(f"  {name}: {'ok' if not found else 'FAILS'} ({time.perf_counter() - start:.0f} s)", flush=True)
            for line in found:
                print(f"    {line}", flush=True)
            failed += bool(found)
        return 1 if failed else 0
    codes = [run_variant(name, notebooks) for name in (args.variant or list(VARIANTS))]
    return 1 if any(codes) else 0


if __name__ == "__main__":
    sys.exit(main())
