"""Execute the book's notebooks in parallel, once per content, into the cache the book build reads.

    python _ext/course_execution.py                  # what `make book` runs before `jupyter-book build`
    python _ext/course_execution.py --jobs 1         # one notebook at a time
    python _ext/course_execution.py --fresh-kernels  # every kernel started afresh (see below)

Every notebook in ``_toc.yml`` runs in a kernel of its own, as many at once as the machine has cores, each
kernel on one thread (``OMP_NUM_THREADS=1``: two busy kernels that each spread over both cores only stall each
other). Each worker forks its kernels from a **zygote** (``_ext/kernel_zygote.py``), a process that has
imported PyTorch once: a kernel forked from it starts as a fresh one would (same folder, ``sys.path``,
environment and arguments; ``tests/book/test_execution.py`` compares the two) without the 2.5-3 s of CPU
that importing PyTorch costs every fresh kernel, once per notebook.

The executed notebooks go into a jupyter-cache folder ``_build/.jupyter_cache/course-<key>``, where the book
build (``execute_notebooks: cache`` in ``_config.yml``) takes their outputs instead of running them again.
What decides whether a notebook runs again:

- jupyter-cache finds a notebook's record by a hash of its code cells (their source and metadata) and its
  kernelspec, so an edited code cell re-executes that notebook alone, and edited prose re-executes nothing;
- the cache folder's name is a hash of what every notebook imports and runs under (the course package's
  files, ``requirements.txt``, the Python version, the kernels' environment below), so a changed library
  re-executes every notebook, into a new folder;
- a fresh clone has no ``_build/``, so CI executes everything.

Each record carries the notebook's wall time and its **kernel CPU time** (user and system time of the
kernel and of the processes it waited for: ``wait4`` in the zygote, or ``RUSAGE_CHILDREN`` of the worker that
started a fresh kernel; a zygote's own start-up is charged to the first notebook it runs), which the Runtimes
page shows and the budget tests check (``_ext/course_site.py``, ``tests/book``), and the machine's speed when
it ran: each worker times a fixed workload just before and just after each notebook
(``_ext/cpu_calibration.py``, in a child of its zygote; the mean of the two), and the budgets are checked in
the reference machine's seconds, so that a slower or busier machine does not fail them. A cell that raises
fails the run: every notebook still runs, then each failure is printed with its traceback and the exit
status is 1, so the book is never built from a partly executed notebook.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import multiprocessing
import os
import queue
import resource
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE_ROOT = Path("_build") / ".jupyter_cache"
CACHE_PREFIX = "course-"
PACKAGE = Path("src") / "attention_course"
# The kernels' environment: the book shows what the CPU computes, with the interactive figures precomputed
# into frames, reproducible hashing, and one thread per kernel. It is part of the cache folder's name.
KERNEL_ENV = {
    "ATTENTION_COURSE_DEVICE": "cpu",
    "ATTENTION_COURSE_STATIC_FIGURES": "1",
    "PYTHONHASHSEED": "0",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
CPU_KEY, WALL_KEY = "kernel_cpu_s", "execution_seconds"  # the cache record's data; WALL_KEY is myst-nb's name
# How fast the machine was when the notebook ran: the CPU seconds of _ext/cpu_calibration.py's fixed workload,
# timed just before the notebook and just after it, the mean (the budgets convert its kernel CPU into the
# reference machine's seconds)
CALIBRATION_KEY = "calibration_cpu_s"
KEPT_CACHES = 3  # cache folders kept: the current one and the two used last (switching branches back and forth)


# --- where the cache is -----------------------------------------------------------------------------------------


def content_key(root: Path = ROOT) -> str:
    """A hash of everything outside a notebook that its outputs depend on (see the module docstring)."""
    digest = hashlib.sha256()
    package = root / PACKAGE
    files = sorted(
        path
        for path in package.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in {".pyc", ".pyo"}
    )
    for path in [*files, root / "requirements.txt"]:
        if path.exists():
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(sys.version.encode())
    digest.update(repr(sorted(KERNEL_ENV.items())).encode())
    return digest.hexdigest()[:16]


def cache_folder(root: Path = ROOT) -> Path:
    """The jupyter-cache folder for the current library and settings: ``_build/.jupyter_cache/course-<key>``."""
    return root / CACHE_ROOT / f"{CACHE_PREFIX}{content_key(root)}"


def prune_caches(current: Path, keep: int = KEPT_CACHES) -> list[Path]:
    """Remove all but the ``keep`` most recently used cache folders beside ``current``; return those removed."""
    if not current.parent.is_dir():
        return []
    others = sorted(
        (path for path in current.parent.glob(f"{CACHE_PREFIX}*") if path.is_dir() and path != current),
        key=lambda path: path.stat().st_mtime,
        reverse=True,
    )
    removed = others[max(keep - 1, 0) :]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


# --- which notebooks --------------------------------------------------------------------------------------------


def book_notebooks(root: Path = ROOT) -> list[Path]:
    """Every notebook the table of contents lists, in its order (new lessons are picked up from _toc.yml)."""
    import yaml

    toc = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))
    entries = [toc["root"]]
    for part in toc.get("parts", []):
        entries.extend(chapter["file"] for chapter in part.get("chapters", []))
    return [root / f"{entry}.ipynb" for entry in entries if (root / f"{entry}.ipynb").exists()]


def cell_timeout(root: Path = ROOT) -> int:
    import yaml

    config = yaml.safe_load((root / "_config.yml").read_text(encoding="utf-8"))
    return int((config.get("execute") or {}).get("timeout", 600))


def cached_record(cache, notebook):
    """The cache record of ``notebook`` (a NotebookNode) that carries a kernel CPU time, or None."""
    try:
        record = cache.match_cache_notebook(notebook)
    except KeyError:
        return None
    data = record.data or {}
    return record if CPU_KEY in data and CALIBRATION_KEY in data else None


def known_cpu_times(cache_root: Path) -> dict[str, float]:
    """``{notebook path: kernel CPU seconds}`` from every cache folder, to start the longest notebooks first."""
    from jupyter_cache import get_cache

    known: dict[str, float] = {}
    if not cache_root.is_dir():
        return known
    for folder in sorted(cache_root.glob(f"{CACHE_PREFIX}*"), key=lambda path: path.stat().st_mtime):
        if not (folder / "global.db").exists():
            continue
        for record in get_cache(str(folder)).list_cache_records():
            if CPU_KEY in (record.data or {}):
                known[record.uri] = float(record.data[CPU_KEY])
    return known


# --- executing one notebook (in a worker process) -----------------------------------------------------------------


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class KernelZygote:
    """This worker's kernel zygote (``_ext/kernel_zygote.py``): a kernel per notebook, forked with PyTorch imported.

    The zygote's own start-up CPU time (interpreter and imports) is charged to the first notebook it runs, so
    that the book's total still counts every second of kernel CPU; each later notebook is charged its forked
    kernel's CPU only, the import it no longer repeats left out.
    """

    def __init__(self) -> None:
        requests_read, requests_write = os.pipe()
        replies_read, replies_write = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, str(ZYGOTE), str(requests_read), str(replies_write)],
            pass_fds=(requests_read, replies_write),
        )
        os.close(requests_read)
        os.close(replies_write)
        self._requests, self._replies, self._buffer = requests_write, replies_read, b""
        self.unclaimed_cpu = float(self._read(STARTUP_TIMEOUT)["preload_cpu_s"])

    def _read(self, timeout: float) -> dict:
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self._replies], [], [], timeout)
            if not ready:
                raise TimeoutError(f"the kernel zygote sent nothing for {timeout:.0f} s")
            chunk = os.read(self._replies, 65536)
            if not chunk:
                raise RuntimeError(f"the kernel zygote exited (status {self.process.wait()})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def calibrate(self) -> float:
        """CPU seconds of ``_ext/cpu_calibration.py``'s workload, run now in a child of the zygote."""
        try:
            os.write(self._requests, b'{"calibrate": true}\n')
        except BrokenPipeError:
            raise RuntimeError(f"the kernel zygote exited (status {self.process.wait()})") from None
        answer = self._read(STARTUP_TIMEOUT)
        if "calibration_cpu_s" not in answer:
            raise RuntimeError(f"the CPU calibration failed in the kernel zygote: {answer}")
        return float(answer["calibration_cpu_s"])

    def execute(self, notebook, timeout: int, cwd: str) -> tuple[float, str | None]:
        """Run ``notebook`` (a NotebookNode, filled in place) in a forked kernel: ``(kernel CPU s, error)``."""
        from jupyter_client.connect import write_connection_file

        handle, connection_file = tempfile.mkstemp(prefix="course-kernel-", suffix=".json")
        os.close(handle)
        write_connection_file(connection_file, ip="127.0.0.1", key=secrets.token_hex(16).encode())
        try:
            request = json.dumps({"connection_file": connection_file, "cwd": cwd}) + "\n"
            try:
                os.write(self._requests, request.encode())
            except BrokenPipeError:
                raise RuntimeError(f"the kernel zygote exited (status {self.process.wait()})") from None
            pid = int(self._read(STARTUP_TIMEOUT)["pid"])
            error = None
            try:
                _run_in_kernel(notebook, timeout, connection_file, pid)
            except Exception:  # as for a fresh kernel: a cell's error, a timeout, a kernel that died
                error = traceback.format_exc()
            if _alive(pid):  # a kernel that died needs no request
                _request_shutdown(connection_file)
            try:
                exited = self._read(SHUTDOWN_TIMEOUT)
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                exited = self._read(STARTUP_TIMEOUT)
        finally:
            os.unlink(connection_file)
        cpu, self.unclaimed_cpu = float(exited["cpu_s"]) + self.unclaimed_cpu, 0.0
        return cpu, error


ZYGOTE = Path(__file__).with_name("kernel_zygote.py")
STARTUP_TIMEOUT, SHUTDOWN_TIMEOUT = 120.0, 30.0
_zygote: KernelZygote | None = None  # this worker's, started by start_worker
_calibration_cpu_s: float | None = None  # without a zygote: the machine's speed as the worker started


def measure_calibration() -> float:
    """CPU seconds of ``_ext/cpu_calibration.py``'s workload, run now in a process with the kernels' settings."""
    completed = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parent / "cpu_calibration.py")],
        env={**os.environ, **KERNEL_ENV},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"the CPU calibration failed:\n{completed.stderr}")
    return float(json.loads(completed.stdout.strip().splitlines()[-1])["cpu_s"])


def _run_in_kernel(notebook, timeout: int, connection_file: str, pid: int) -> None:
    """nbclient's execution of ``notebook`` in the running kernel ``pid`` that ``connection_file`` describes."""
    from jupyter_client import AsyncKernelManager
    from nbclient import NotebookClient

    class ForkedKernelManager(AsyncKernelManager):
        async def _async_is_alive(self) -> bool:  # nbclient's check for a kernel that died mid-cell
            return _alive(pid)

        is_alive = _async_is_alive  # the manager's name for it; its client calls the one above

    class ForkedKernelClient(NotebookClient):
        async def async_start_new_kernel(self, **kwargs) -> None:
            """The zygote has started it."""

    manager = ForkedKernelManager(connection_file=connection_file, owns_kernel=False)
    manager.load_connection_file()
    client = ForkedKernelClient(notebook, km=manager, **_client_options(timeout))
    try:
        client.execute()
    finally:
        if client.kc is not None:
            client.kc.stop_channels()


def _alive(pid: int) -> bool:
    """Whether the kernel ``pid`` still runs (the zygote reaps it as soon as it exits)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _request_shutdown(connection_file: str) -> None:
    """Ask the kernel to exit as nbclient does (a shutdown request), so that its exit handlers run."""
    from jupyter_client import BlockingKernelClient

    client = BlockingKernelClient(connection_file=connection_file)
    client.load_connection_file()
    client.start_channels()
    try:
        request = client.shutdown()
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT
        while time.monotonic() < deadline:  # the reply: the request has arrived (closing sooner may drop it)
            reply = client.get_control_msg(timeout=max(deadline - time.monotonic(), 0.01))
            if reply.get("parent_header", {}).get("msg_id") == request:
                break
    except queue.Empty:  # no reply: the caller kills the kernel
        pass
    finally:
        client.stop_channels()


def _client_options(timeout: int) -> dict:
    return {
        "timeout": timeout,
        "allow_errors": False,
        "record_timing": False,  # timings in the cells' metadata would change jupyter-cache's hash of the notebook
    }


def start_worker(preloaded_kernels: bool) -> None:
    """A worker's start: the kernels' environment, and its kernel zygote unless fresh kernels are asked for."""
    global _zygote
    os.environ.update(KERNEL_ENV)  # before the zygote starts: it imports PyTorch with one thread
    if preloaded_kernels:
        try:
            _zygote = KernelZygote()
        except Exception as problem:  # the book still builds, each notebook in a fresh kernel
            print(f"course_execution: no kernel zygote ({problem}); fresh kernels instead", flush=True)


def execute_notebook(path: str, timeout: int) -> dict:
    """Run the notebook at ``path`` in its own kernel started from this process; return what happened.

    ``{"path", "notebook" (the executed notebook as JSON text, None on failure), "error" (None or the
    traceback), "cpu_s", "wall_s"}``. A ``python3`` notebook runs in a kernel forked by this worker's zygote,
    which reports the kernel's CPU time; any other kernel (or none, without a zygote) is started by nbclient,
    and is then this process's only child, which nbclient waits for, so the growth of ``RUSAGE_CHILDREN``
    over the run is its CPU time.
    """
    import nbformat
    from nbclient import NotebookClient

    os.environ.update(KERNEL_ENV)
    source = nbformat.read(path, as_version=4)
    notebook = copy.deepcopy(source)
    kernel = (source.metadata.get("kernelspec") or {}).get("name", "python3")
    folder = str(Path(path).parent)  # the notebook's folder, as run_in_temp: false
    cpu, wall = _children_cpu(), time.perf_counter()
    error, wall_s = None, None
    global _zygote, _calibration_cpu_s
    calibration = None
    if _zygote is not None and kernel == "python3":
        try:
            calibration = _zygote.calibrate()  # the machine's speed just before the notebook runs
            wall = time.perf_counter()
            cpu_s, error = _zygote.execute(notebook, timeout, folder)
            wall_s = time.perf_counter() - wall
        except Exception:  # the zygote itself failed: this notebook fails, the next ones get fresh kernels
            cpu_s, error, _zygote = 0.0, traceback.format_exc(), None
        if _zygote is not None and calibration is not None:
            # and just after it: a notebook of a minute or more meets whatever the other worker runs meanwhile,
            # which one timing before it can miss (chapter 13 read 0.216 s before it in one build and came
            # out at 83.8 reference seconds, against 69.5 in another)
            try:
                calibration = (calibration + _zygote.calibrate()) / 2
            except Exception:  # the zygote is gone: the timing before the notebook stands
                _zygote = None
    else:
        client = NotebookClient(
            notebook, kernel_name=kernel, resources={"metadata": {"path": folder}}, **_client_options(timeout)
        )
        try:
            client.execute()
        except Exception:  # a cell's error, a timeout, a kernel that died: all reported with the notebook's name
            error = traceback.format_exc()
        cpu_s = _children_cpu() - cpu
    if calibration is None:  # a fresh kernel: the speed measured once per worker, by a process of its own
        if _calibration_cpu_s is None:
            _calibration_cpu_s = measure_calibration()
        calibration = _calibration_cpu_s
    wall_s = time.perf_counter() - wall if wall_s is None else wall_s
    result = {"path": path, "cpu_s": round(cpu_s, 2), "wall_s": round(wall_s, 2),
              "calibration_cpu_s": calibration}
    if error is None:
        # Same code cells as the source (nbclient only adds outputs): the cache must match the source's hash.
        notebook.metadata["kernelspec"] = source.metadata.get("kernelspec", notebook.metadata.get("kernelspec"))
        for executed, original in zip(notebook.cells, source.cells):
            executed.metadata = original.metadata
    result["notebook"] = None if error else nbformat.writes(notebook)
    result["error"] = error
    return result


# --- executing the book ---------------------------------------------------------------------------------------------


def relative(path: Path, root: Path = ROOT) -> str:
    return path.resolve().relative_to(root.resolve()).as_posix()


def execute_book(
    notebooks: list[Path],
    cache_path: Path,
    jobs: int,
    timeout: int,
    root: Path = ROOT,
    preloaded_kernels: bool = True,
) -> dict[str, list[str]]:
    """Execute the notebooks that the cache lacks, ``jobs`` at a time, and cache those that succeed.

    With ``preloaded_kernels`` each worker forks its kernels from a zygote that has imported PyTorch once
    (``_ext/kernel_zygote.py``); without, each notebook starts a fresh kernel.

    Returns ``{"executed": [...], "failed": [...]}``, notebooks named relative to ``root``.
    """
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    cache_path.mkdir(parents=True, exist_ok=True)
    os.utime(cache_path)  # the most recently used cache folder is kept by prune_caches
    cache = get_cache(str(cache_path))
    stale = [path for path in notebooks if cached_record(cache, nbformat.read(path, as_version=4)) is None]
    print(
        f"course_execution: {len(notebooks) - len(stale)} of {len(notebooks)} notebooks up to date in "
        f"{relative(cache_path, root)}; executing {len(stale)} on {jobs} worker(s), one thread each",
        flush=True,
    )
    if not stale:
        return {"executed": [], "failed": []}
    # Longest first (kernel CPU times of earlier runs, in any cache folder), so that no long notebook starts
    # last; notebooks never timed come first: lessons before exercises, later lessons (usually the longest)
    # before earlier ones.
    known = known_cpu_times(cache_path.parent)

    def order(path: Path) -> tuple:
        lesson = path.parent.name == "chapters"
        return (str(path) in known, -known.get(str(path), 0.0), not lesson, -notebooks.index(path))

    stale.sort(key=order)

    started, done_names, failures, total_cpu = time.perf_counter(), [], [], 0.0
    context = multiprocessing.get_context("spawn")  # no inherited event loops or zmq sockets in the workers
    with ProcessPoolExecutor(
        max_workers=jobs, mp_context=context, initializer=start_worker, initargs=(preloaded_kernels,)
    ) as pool:
        futures = [pool.submit(execute_notebook, str(path), timeout) for path in stale]
        for done, future in enumerate(as_completed(futures), start=1):
            result = future.result()
            name = relative(Path(result["path"]), root)
            total_cpu += result["cpu_s"]
            status = "FAILED" if result["error"] else "ok"
            print(
                f"  [{done}/{len(stale)}] {name}: {status}, {result['cpu_s']:.1f} s kernel CPU, "
                f"{result['wall_s']:.1f} s wall",
                flush=True,
            )
            if result["error"]:
                failures.append((name, result["error"]))
                last_lines = [line for line in result["error"].strip().splitlines() if line.strip()][-3:]
                print("      " + "\n      ".join(last_lines), flush=True)  # the whole traceback comes at the end
                continue
            outputs = nbformat.reads(result["notebook"], as_version=4)
            data = {WALL_KEY: result["wall_s"], CPU_KEY: result["cpu_s"], CALIBRATION_KEY: result["calibration_cpu_s"]}
            bundle = CacheBundleIn(outputs, result["path"], data=data)
            cache.cache_notebook_bundle(bundle, check_validity=False, overwrite=True)
            source = nbformat.read(result["path"], as_version=4)
            if cached_record(cache, source) is None:  # would make the book build execute it a second time
                failures.append((name, "the executed notebook's cache record does not match its source"))
            else:
                done_names.append(name)
    print(
        f"course_execution: executed {len(stale)} notebooks in {time.perf_counter() - started:.0f} s wall, "
        f"{total_cpu:.0f} s kernel CPU",
        flush=True,
    )
    for name, error in failures:
        print(f"\n== {name} failed:\n{error}", file=sys.stderr, flush=True)
    return {"executed": done_names, "failed": [name for name, _ in failures]}


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks to execute (default: every one in _toc.yml)")
    parser.add_argument("--jobs", type=int, default=available_cores(), help="notebooks at once (default: the cores)")
    parser.add_argument(
        "--fresh-kernels",
        action="store_true",
        help="start every kernel afresh instead of forking it from a zygote that has imported PyTorch",
    )
    args = parser.parse_args(argv)
    notebooks = [path.resolve() for path in args.notebooks] or book_notebooks(ROOT)
    missing = [str(path) for path in notebooks if not path.exists()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    current = cache_folder(ROOT)
    for removed in prune_caches(current):
        print(f"course_execution: removed the old cache {relative(removed)}", flush=True)
    failed = execute_book(
        notebooks, current, args.jobs, cell_timeout(ROOT), ROOT, preloaded_kernels=not args.fresh_kernels
    )["failed"]
    if failed:
        print(f"course_execution: {len(failed)} notebook(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
