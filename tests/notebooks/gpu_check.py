"""Do the lessons run, and do their claims hold, at the sizes a GPU learner gets? Execute them as Colab does.

The book build and the tests pin every lesson to the CPU and draw interactive figures as precomputed
frames. A learner on a Colab GPU runtime gets something else: ``ac.workload(cpu=..., gpu=...)`` returns the
larger GPU sizes, nothing pins the device, and interactive figures are live ipywidgets. This tool executes
every lesson and every exercise solution that way, each in a fresh kernel:

    python -m tests.notebooks.gpu_check                       # every lesson and solution (make gpu-check)
    python -m tests.notebooks.gpu_check chapters/01_why_attention.ipynb --jobs 1 --cell-limit 900

- On a machine with CUDA the lessons run on the GPU. Without one they run on the CPU with the GPU sizes
  forced (``ATTENTION_COURSE_WORKLOAD=gpu``): slow, but every claim is checked at the sizes a GPU learner
  gets. Either way no ``ATTENTION_COURSE_DEVICE`` or ``ATTENTION_COURSE_STATIC_FIGURES`` reaches the
  kernels.
- Notebooks run in parallel processes (``--jobs``), each kernel with ``OMP_NUM_THREADS`` set to its share
  of the cores, or the CPU cells of many kernels starve each other.
- Each cell's time is logged (``--log-dir``, one file per notebook, with the executed notebook beside it
  when ``--keep`` is given); a cell that runs longer than
  ``--cell-limit`` seconds is stopped and named, and the notebook's remaining cells are skipped.
- Exercise checks run without bubblewrap, as on Colab, where it is not installed: the check then runs the
  learner's code unisolated and says so (``--with-bwrap`` keeps the sandbox where the machine has one).
- At the end it lists every failing claim with its notebook, cell, the line that raised and the message.
- On a GPU it appends the run (GPU name, date, each notebook's wall and kernel CPU time) to
  ``chapters/gpu_runs.json``, which the Runtimes page shows; ``--no-record`` skips that.

A bare GPU machine (PyTorch with CUDA, nothing else) lacks what the notebooks and this tool import. With
``--install`` the tool creates ``.gpu-venv`` (a virtual environment that sees the system's PyTorch),
installs the course there, from the wheel directory ``.whl/`` when it exists (no network needed) or else
from the package index, and re-runs itself inside it. Prepare the wheels on a machine with network access
with ``--prepare-wheels`` (add ``--python-version 3.12`` for a GPU machine with another Python).

It is a tool for authors (``make gpu-check``), not part of ``make test``: on two CPU cores the emulation
takes a long time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / ".whl"
GPU_VENV = ROOT / ".gpu-venv"
RECORD = ROOT / "chapters" / "gpu_runs.json"
# What the notebooks and this tool import beyond PyTorch (the course package brings the rest).
NEEDED_MODULES = ("nbclient", "nbformat", "ipykernel", "ipywidgets", "matplotlib", "tqdm", "attention_course",
                  "safetensors", "transformers")  # the last two: chapter 13b's checkpoints (the package's extra)
# The environment the book build sets and a Colab learner does not have.
PINNED = ("ATTENTION_COURSE_DEVICE", "ATTENTION_COURSE_STATIC_FIGURES", "ATTENTION_COURSE_WORKLOAD")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
FAILING_LINE = re.compile(r"^\s*-+>\s*\d+ ")  # IPython marks the line that raised: "---> 14 assert ..."
CLAIM = re.compile(r"^\s*# Claim:\s*(?P<text>.*\S)\s*$")


def default_notebooks() -> list[Path]:
    return sorted((ROOT / "chapters").glob("*.ipynb")) + sorted((ROOT / "exercises" / "solutions").glob("*.ipynb"))


def name_of(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


# --- one notebook, in a child process ------------------------------------------------------------------------------


def describe_error(cell, output: dict) -> dict:
    """The line that raised, the claims the cell guards, and the exception's message."""
    trace = ANSI.sub("", "\n".join(output.get("traceback", [])))
    line = next((row.strip() for row in trace.splitlines() if FAILING_LINE.match(row)), "")
    claims = [match["text"] for match in map(CLAIM.match, cell.source.splitlines()) if match]
    return {"line": line, "claims": claims, "message": f"{output.get('ename')}: {output.get('evalue')}".strip()}


def run_notebook(path: Path, cell_limit: float, log, keep: Path | None = None) -> dict:
    """Execute ``path`` in a fresh kernel; return its timings and failures. Cell times go to ``log``."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    notebook = nbformat.read(path, as_version=4)
    started: dict[int, float] = {}
    cell_seconds: dict[int, float] = {}

    def on_start(cell, cell_index):
        started[cell_index] = time.perf_counter()

    def on_executed(cell, cell_index, execute_reply):
        cell_seconds[cell_index] = time.perf_counter() - started.get(cell_index, time.perf_counter())
        first = next((row for row in cell.source.splitlines() if row.strip()), "")[:70]
        print(f"cell {cell_index:3d} {cell_seconds[cell_index]:8.2f} s  {first}", file=log, flush=True)

    client = NotebookClient(
        notebook, timeout=cell_limit, allow_errors=True, kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}}, on_cell_start=on_start, on_cell_executed=on_executed,
    )
    stopped = None
    cpu_before = _children_cpu()
    wall = time.perf_counter()
    try:
        client.execute()
    except CellTimeoutError:
        index = max(started)
        first = next((row for row in notebook.cells[index].source.splitlines() if row.strip()), "")[:70]
        stopped = {"cell": index, "seconds": cell_limit, "first_line": first}
        print(f"cell {index:3d} STOPPED after {cell_limit:g} s  {first}", file=log, flush=True)
    except DeadKernelError as error:
        index = max(started) if started else -1
        stopped = {"cell": index, "seconds": None, "first_line": f"the kernel died: {error}"}
    wall = time.perf_counter() - wall
    if keep is not None:
        nbformat.write(notebook, keep)
    failures = []
    for index, cell in enumerate(notebook.cells):
        if stopped and index == stopped["cell"]:
            continue  # its KeyboardInterrupt is the stop, reported as such
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                failures.append({"cell": index, **describe_error(cell, output)})
    slowest = sorted(cell_seconds.items(), key=lambda item: -item[1])[:3]
    return {
        "notebook": name_of(path),
        "wall_s": round(wall, 1),
        "kernel_cpu_s": round(_children_cpu() - cpu_before, 1),
        "slowest_cells": [[index, round(seconds, 1)] for index, seconds in slowest],
        "stopped": stopped,
        "failures": failures,
    }


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# --- the parent: environment, parallel runs, report ----------------------------------------------------------------


def device_description() -> tuple[bool, str]:
    """Whether CUDA is present, and the device's name (the GPU's, or "CPU, GPU sizes emulated")."""
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(0)
        return True, f"{torch.cuda.get_device_name(0)} (compute capability {major}.{minor})"
    return False, "CPU, GPU sizes emulated"


def kernel_environment(cuda: bool, threads: int, kernels_dir: Path, ipython_dir: Path | None = None) -> dict[str, str]:
    """The environment of each kernel: nothing pinned, as on Colab; GPU sizes forced when there is no GPU;
    IPython's start-up files from ``ipython_dir`` when given."""
    env = {key: value for key, value in os.environ.items() if key not in PINNED}
    if ipython_dir is not None:
        env["IPYTHONDIR"] = str(ipython_dir)
    if not cuda:
        env["ATTENTION_COURSE_WORKLOAD"] = "gpu"
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    env["PYTHONHASHSEED"] = "0"
    # The kernel is this interpreter, whatever other "python3" kernels the machine has registered.
    env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(kernels_dir), env.get("JUPYTER_PATH")]))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    return env


# Run by every kernel at start-up (an IPython start-up file) unless --with-bwrap: bubblewrap looks absent.
NO_BWRAP_STARTUP = """\
import attention_course.grading.isolation as _isolation  # gpu-check: no bubblewrap, as on Colab
_isolation.bwrap_path = lambda: None
del _isolation
"""


def write_ipython_startup(directory: Path) -> None:
    startup = directory / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    (startup / "00-no-bwrap.py").write_text(NO_BWRAP_STARTUP)


def write_kernel_spec(directory: Path) -> None:
    spec = directory / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"}))


def run_child(path: Path, env: dict[str, str], cell_limit: float, log_dir: Path, keep: bool) -> dict:
    log = log_dir / (path.stem + ".log")
    result = log_dir / (path.stem + ".json")
    command = [sys.executable, "-m", "tests.notebooks.gpu_check", "--child", str(path), "--cell-limit",
               str(cell_limit), "--log-dir", str(log_dir), *(["--keep"] if keep else [])]
    completed = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    if completed.returncode != 0 or not result.is_file():
        tail = (completed.stderr or completed.stdout)[-2000:]
        return {"notebook": name_of(path), "wall_s": None, "kernel_cpu_s": None, "slowest_cells": [],
                "stopped": None, "failures": [{"cell": -1, "line": "", "claims": [],
                                               "message": f"the runner failed (see {log}): {tail}"}]}
    return json.loads(result.read_text())


def summary_line(result: dict) -> str:
    if result["stopped"]:
        status = f"STOPPED in cell {result['stopped']['cell']}"
    else:
        status = "FAILS" if result["failures"] else "ok"
    slowest = ", ".join(f"cell {index} {seconds:.0f} s" for index, seconds in result["slowest_cells"])
    wall = "?" if result["wall_s"] is None else f"{result['wall_s']:.0f}"
    cpu = "?" if result["kernel_cpu_s"] is None else f"{result['kernel_cpu_s']:.0f}"
    return f"{result['notebook']}: {status} ({wall} s wall, {cpu} s kernel CPU; slowest: {slowest or '-'})"


def record(results: list[dict], device: str, jobs: int, threads: int) -> None:
    """Append this GPU run to chapters/gpu_runs.json (read by the Runtimes page)."""
    import torch

    runs = json.loads(RECORD.read_text()) if RECORD.is_file() else []
    runs.append({
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "device": device,
        "torch": torch.__version__,
        "python": ".".join(map(str, sys.version_info[:3])),
        "parallel_notebooks": jobs,
        "threads_per_kernel": threads,
        "notebooks": {
            Path(r["notebook"]).stem: {"wall_s": r["wall_s"], "kernel_cpu_s": r["kernel_cpu_s"],
                                       "passed": not r["failures"] and not r["stopped"]}
            for r in results
        },
    })
    RECORD.write_text(json.dumps(runs, indent=1) + "\n")
    print(f"recorded this run in {name_of(RECORD)}")


def missing_modules() -> list[str]:
    import importlib.util

    return [name for name in NEEDED_MODULES if importlib.util.find_spec(name) is None]


def install_and_rerun(argv: list[str]) -> int:
    """Create .gpu-venv over the system's PyTorch, install the course into it, and run this tool there."""
    python = GPU_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(GPU_VENV)], check=True)
    # The system's torch satisfies the package's "torch>=2.2": pip keeps it and installs no other. The kernels
    # import the working tree's src/ first (PYTHONPATH), so the installed copy only brings the dependencies.
    if WHEELS.is_dir():
        what = ["--no-index", "--find-links", str(WHEELS), "attention-course[checkpoints]"]
    else:
        what = [f"{ROOT}[checkpoints]"]
    print(f"installing the course into {name_of(GPU_VENV)} from {name_of(WHEELS) if WHEELS.is_dir() else 'the index'}")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *what], check=True)
    rest = [argument for argument in argv if argument != "--install"]
    return subprocess.call([str(python), "-m", "tests.notebooks.gpu_check", *rest], cwd=ROOT)


def prepare_wheels(python_version: str | None) -> int:
    """Download into .whl/ every wheel the course needs beyond PyTorch, and build the course's own wheel."""
    WHEELS.mkdir(exist_ok=True)
    target = ["--python-version", python_version, "--only-binary=:all:"] if python_version else []
    with tempfile.TemporaryDirectory() as scratch:
        # Resolve the course's dependencies without torch: the GPU machine brings its own CUDA build.
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", scratch, str(ROOT)],
                       check=True)
        built = next(Path(scratch).glob("*.whl"))
        shutil.copy(built, WHEELS)
        import tomllib  # Python 3.11 and newer: prepare the wheels with one

        project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        dependencies = project["dependencies"] + project["optional-dependencies"]["checkpoints"]
        needed = [dep for dep in dependencies if not dep.startswith("torch")]
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "-d", str(WHEELS), *target, *needed],
                       check=True)
    print(f"{len(list(WHEELS.glob('*.whl')))} wheels in {name_of(WHEELS)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks (default: every lesson and solution)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="notebooks run at once (default: 8 on a GPU, 2 otherwise, at most the cores)")
    parser.add_argument("--cell-limit", type=float, default=None,
                        help="seconds after which a cell is stopped (default: 300 on a GPU, 1800 otherwise)")
    parser.add_argument("--log-dir", type=Path, default=ROOT / "_build" / "gpu-check",
                        help="where each notebook's cell times go (default: _build/gpu-check)")
    parser.add_argument("--with-bwrap", action="store_true",
                        help="let exercise checks use bubblewrap (default: hidden, as on Colab)")
    parser.add_argument("--keep", action="store_true", help="save each executed notebook in the log directory")
    parser.add_argument("--no-record", action="store_true", help="do not add a GPU run to chapters/gpu_runs.json")
    parser.add_argument("--install", action="store_true",
                        help="install what is missing into .gpu-venv (from .whl/ if present) and run there")
    parser.add_argument("--prepare-wheels", action="store_true", help="download the wheels into .whl/ and stop")
    parser.add_argument("--python-version", help="with --prepare-wheels: the GPU machine's Python, e.g. 3.12")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.prepare_wheels:
        return prepare_wheels(args.python_version)
    missing = missing_modules()
    if missing:
        if args.install:
            return install_and_rerun(argv)
        parser.error(f"missing {', '.join(missing)}: run with --install (uses .whl/ when present)")
    notebooks = [path.resolve() for path in args.notebooks] or default_notebooks()
    absent = [str(path) for path in notebooks if not path.is_file()]
    if absent:
        parser.error(f"no such notebook: {', '.join(absent)}")
    args.log_dir.mkdir(parents=True, exist_ok=True)

    if args.child:
        (path,) = notebooks
        with open(args.log_dir / (path.stem + ".log"), "w") as log:
            result = run_notebook(path, args.cell_limit, log,
                                  args.log_dir / path.name if args.keep else None)
        (args.log_dir / (path.stem + ".json")).write_text(json.dumps(result))
        return 0

    cuda, device = device_description()
    cores = os.cpu_count() or 1
    jobs = max(1, min(args.jobs or (8 if cuda else 2), cores, len(notebooks)))
    threads = max(1, cores // jobs)
    cell_limit = args.cell_limit or (300.0 if cuda else 1800.0)
    print(f"== {len(notebooks)} notebooks on {device}: {jobs} at once, OMP_NUM_THREADS={threads}, "
          f"cells stopped after {cell_limit:g} s; cell times in {args.log_dir}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        kernels_dir, ipython_dir = Path(scratch) / "jupyter", Path(scratch) / "ipython"
        write_kernel_spec(kernels_dir)
        if not args.with_bwrap:
            write_ipython_startup(ipython_dir)
        env = kernel_environment(cuda, threads, kernels_dir, None if args.with_bwrap else ipython_dir)
        results = []
        with ThreadPoolExecutor(jobs) as pool:
            futures = [pool.submit(run_child, path, env, cell_limit, args.log_dir, args.keep) for path in notebooks]
            for future in as_completed(futures):
                results.append(future.result())
                print("  " + summary_line(results[-1]), flush=True)
    results.sort(key=lambda result: result["notebook"])
    failing = [(r, f) for r in results for f in r["failures"]]
    stopped = [r for r in results if r["stopped"]]
    for result in stopped:
        s = result["stopped"]
        print(f"STOPPED {result['notebook']} cell {s['cell']} after {s['seconds']} s: {s['first_line']}")
    if failing:
        print(f"== {len(failing)} failing cells:")
        for result, failure in failing:
            claims = f" (claims in the cell: {'; '.join(failure['claims'])})" if failure["claims"] else ""
            print(f"  {result['notebook']}, cell {failure['cell']}: {failure['line']}{claims}\n"
                  f"      {failure['message'][:500]}")
    else:
        print("== no failing claim" + (" (but some cells were stopped)" if stopped else ""))
    if cuda and not args.no_record:
        record(results, device, jobs, threads)
    return 1 if failing or stopped else 0


if __name__ == "__main__":
    sys.exit(main())
