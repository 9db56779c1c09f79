"""Start worker processes, each in a fresh sandbox of its own, ahead of time.

Importing torch takes about a second, far longer than checking a notebook. So the grader keeps a small
**warm pool**: sandboxes started before their job is known, each one a ``bwrap`` process running
``python -I -B`` with the worker (:mod:`attention_course.grading.worker`), which imports torch and the
exercise modules and then waits for its job on stdin. Every attempt at a notebook takes one sandbox and
never gives it back; taking one starts its replacement at once. So a notebook never shares a process,
a filesystem or a PID namespace with another one.

A :class:`Sandbox` gives the grader:

- the worker's channel (:class:`~attention_course.grading.channel.FrameReader` on a pipe the grader
  owns), its output log (a file in a private folder of the grader's, which the sandbox cannot see; the
  worker writes to it only through its stdout and stderr), and its exit status;
- :meth:`Sandbox.kill`: SIGKILL to the sandbox's PID 1 and to bwrap, so that every process inside dies
  with it (a double-forked daemon included), then reaps bwrap and removes the private folder.

Without isolation (``isolated=False``, the grader's ``--no-sandbox``), the same worker runs as a plain
``python -I -B`` process in a session of its own, with the same rlimits, but with the instructor's rights.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from attention_course.grading import memory_cgroup
from attention_course.grading.channel import FrameReader, parse_header
from attention_course.grading.isolation import (
    SANDBOX_UID_BASE,
    Limits,
    _set_pdeathsig,
    package_root,
    sandbox_command,
    worker_environment,
)
from attention_course.grading.worker import bootstrap_source

__all__ = ["OUTPUT_LOG", "STATUS_LOST", "Sandbox", "SandboxPool", "close_pools", "kill_group", "pool",
           "sandbox_uids"]

OUTPUT_LOG = "output.log"
STATUS_LOST = -(2**16)  # exit status of a worker whose fate is unknown
BLOB_LIMIT = 64_000_000  # bytes of one part's outcomes on the channel
CHANNEL_LIMIT = 160_000_000  # bytes of all frames of one worker


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (a worker and everything it started)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


_UIDS_PER_GRADER = 256


def sandbox_uids(grader_pid: int) -> range:
    """The uids a grader process (as root) hands to its sandboxes: a block of its own, chosen by its pid, so
    that two graders on one machine do not share RLIMIT_NPROC counts."""
    start = SANDBOX_UID_BASE + (grader_pid % 8_000) * _UIDS_PER_GRADER
    return range(start, start + _UIDS_PER_GRADER)


class _Uids:
    """As root, each live sandbox gets a uid of its own, so that RLIMIT_NPROC counts its processes only."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._used: set[int] = set()
        self._next = 0

    def take(self) -> int:
        uids = sandbox_uids(os.getpid())
        with self._lock:
            for _ in range(len(uids)):
                uid = uids[self._next % len(uids)]
                self._next += 1
                if uid not in self._used:
                    self._used.add(uid)
                    return uid
        raise RuntimeError(f"more than {len(uids)} sandboxes at once")

    def give_back(self, uid: int) -> None:
        with self._lock:
            self._used.discard(uid)


_uids = _Uids()


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as children:
                found += [int(child) for child in children.read().split()]
    except (OSError, ValueError):
        pass
    return found


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


_PREFIX = "attention-course-grading-"
_swept = False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def sweep_leftovers(folder: Path | None = None) -> list[Path]:
    """Remove the sandbox folders (``attention-course-grading-<pid>-*``, ours only) whose grader or kernel
    has died without cleaning up: a notebook kernel that Jupyter shut down, or a grader killed by a signal,
    never runs its ``atexit``. A folder of a process still alive is kept, and so is one changed in the last
    minute (a grader in another PID namespace sharing this folder). Returns what was removed."""
    removed = []
    for path in Path(folder or tempfile.gettempdir()).glob(f"{_PREFIX}*"):
        pid = path.name[len(_PREFIX):].split("-", 1)[0]
        try:
            info = path.stat()
            if (not pid.isdigit() or info.st_uid != os.geteuid() or time.time() - info.st_mtime < 60
                    or _alive(int(pid))):
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


class Sandbox:
    """One worker process in a fresh sandbox, started before its job is known (see the module docstring).

    Args:
        isolated: run under bubblewrap (else a plain subprocess: ``--no-sandbox``).
        limits: the resource limits of the worker.
        output_limit: bytes of output the worker allows itself (and the file-size limit's floor).
    """

    def __init__(self, isolated: bool, limits: Limits, output_limit: int) -> None:
        global _swept
        if not _swept:
            _swept = True
            sweep_leftovers()
        self.isolated = isolated
        self.started = time.monotonic()
        # 0700, outside the sandbox; named after the grader's pid so that a test can tell its own apart (and
        # sweep_leftovers a dead grader's)
        self.dir = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-"))
        self.log = self.dir / OUTPUT_LOG
        self._uid = _uids.take() if isolated and os.geteuid() == 0 else None
        self._killed = False
        self.peak_memory: int | None = None  # bytes, from the memory cgroup, once killed
        self.shared_memory_limited: bool | None = None  # kernel.shm* set in its IPC namespace (as root)
        self._limits = limits
        read_end, write_end = os.pipe()
        settings = {
            # Every file, the output log included, stops one byte past the output limit (RLIMIT_FSIZE).
            "file_size": output_limit + 1,
            "processes": limits.processes,
            "cpu_seconds": limits.cpu_seconds,
            "memory": limits.memory,
        }
        argv = [sys.executable, "-I", "-B", "-c", bootstrap_source(str(package_root()), write_end,
                                                                   settings)]
        log = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        # One memory limit for the whole sandbox, children and shared memory included (memory_cgroup).
        self.cgroup = memory_cgroup.create(limits.cgroup_limit) if isolated else None
        cgroup = self.cgroup

        def before_exec() -> None:  # in the child: everything the sandbox starts is inside the cgroup
            _set_pdeathsig()
            if cgroup is not None:
                cgroup.enter()

        try:
            if isolated:
                command = sandbox_command(argv, uid=self._uid, limits=limits)
                if cgroup is None and memory_cgroup.cgroup_support()[0] == "systemd":
                    command = memory_cgroup.systemd_prefix(limits.cgroup_limit) + command
                env = worker_environment()
            else:
                command, env = argv, worker_environment()
            self._proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log, stderr=log, env=env,
                                          pass_fds=(write_end,), start_new_session=True,
                                          cwd=self.dir if not isolated else "/", preexec_fn=before_exec)
        except BaseException:
            os.close(read_end)
            if self.cgroup is not None:
                self.cgroup.remove()
            self._cleanup_files()
            raise
        finally:
            os.close(write_end)
            os.close(log)
        self.pid = self._proc.pid
        self.channel = FrameReader(read_end, max_frames=1, max_bytes=CHANNEL_LIMIT, blob_limit=BLOB_LIMIT)
        _live.add(self)

    # --- starting -----------------------------------------------------------------------------------
    def wait_ready(self, timeout: float) -> bool:
        """Whether the worker said ``ready`` (imports done, no learner code run yet) within ``timeout``."""
        self.channel.wait(1, timeout)
        frames = self.channel.take(0)
        ready = bool(frames) and (parse_header(frames[0]) or {}).get("step") == "ready"
        if ready and self.isolated and self.shared_memory_limited is None:
            inside = _children(self.pid)  # the sandbox's first process: its IPC namespace is the sandbox's
            self.shared_memory_limited = bool(inside) and memory_cgroup.limit_shared_memory(
                inside[0], self._limits.cgroup_limit)
        return ready

    def send_job(self, job_bytes: bytes, max_frames: int) -> None:
        """Give the worker its job (once). Writes from a thread: a worker that stopped reading cannot block
        the grader."""
        self.channel.allow(max_frames + 1)  # + the ready frame
        stdin = self._proc.stdin
        assert stdin is not None

        def write() -> None:
            try:
                stdin.write(job_bytes)
                stdin.close()
            except (OSError, ValueError):
                pass

        threading.Thread(target=write, daemon=True).start()

    # --- watching -----------------------------------------------------------------------------------
    def poll(self) -> int | None:
        return self._proc.poll()

    def output_size(self) -> int:
        try:
            return self.log.stat().st_size
        except OSError:
            return 0

    def output_tail(self, size: int = 2000) -> str:
        try:
            with open(self.log, "rb") as log:
                log.seek(max(0, self.output_size() - size))
                return log.read(size).decode("utf-8", errors="replace")
        except OSError:
            return ""

    # --- ending -------------------------------------------------------------------------------------
    def kill(self) -> None:
        """Kill everything in the sandbox, reap it and remove its private folder (idempotent)."""
        if self._killed:
            return
        self._killed = True
        try:
            inside = _children(self.pid) if self.isolated else []  # bwrap's child: PID 1 of the sandbox
            for pid in inside:
                try:
                    os.kill(pid, signal.SIGKILL)  # PID 1 dying takes the whole PID namespace with it
                except OSError:
                    pass
            kill_group(self.pid)
            try:
                self._proc.kill()
            except OSError:
                pass
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not fail
                pass
            deadline = time.monotonic() + 10
            while inside and time.monotonic() < deadline and not all(_gone(pid) for pid in inside):
                time.sleep(0.01)
            self.channel.join(5)
            if self._proc.stdin is not None:
                try:
                    self._proc.stdin.close()
                except OSError:
                    pass
        finally:
            if self.cgroup is not None:
                self.peak_memory = self.cgroup.peak()
                self.cgroup.remove()  # kills whatever is left in it, wherever it hid
            if self._uid is not None:
                _uids.give_back(self._uid)
            self._cleanup_files()
            _live.discard(self)

    def _cleanup_files(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


_live: set[Sandbox] = set()


class SandboxPool:
    """Sandboxes started ahead of need: :meth:`take` hands out a fresh one and starts its replacement.

    Args:
        isolated, limits, output_limit: as for :class:`Sandbox`.
        size: sandboxes kept warm (one per notebook graded at a time; 0: none, start each when needed).
    """

    def __init__(self, isolated: bool, limits: Limits, output_limit: int, size: int = 1) -> None:
        self._key = (isolated, limits, output_limit)
        self._size = max(0, size)
        self._lock = threading.Lock()
        self._warm: list[Sandbox] = []
        self.closed = False

    def _start(self) -> Sandbox:
        return Sandbox(*self._key)

    def take(self, refill: bool = True) -> Sandbox:
        """A sandbox no job has used; keeps the pool topped up (with ``refill``; else ``fill()`` later, e.g.
        once the job is done, so that the replacement's start does not compete with it for the processor)."""
        with self._lock:
            if self.closed:
                raise RuntimeError("the sandbox pool is closed")
            sandbox = self._warm.pop(0) if self._warm else None
        if sandbox is not None and sandbox.poll() is not None:  # died while waiting (killed from outside?)
            sandbox.kill()
            sandbox = None
        if sandbox is None:
            sandbox = self._start()
        if refill:
            self.fill()
        return sandbox

    def fill(self) -> None:
        with self._lock:
            if self.closed:
                return
            missing = self._size - len(self._warm)
        for _ in range(missing):
            fresh = self._start()
            with self._lock:
                if self.closed:
                    fresh.kill()
                    return
                self._warm.append(fresh)

    def resize(self, size: int) -> None:
        with self._lock:
            self._size = max(0, size)

    def close(self) -> None:
        """Kill every warm sandbox (the pool can no longer be used)."""
        with self._lock:
            self.closed = True
            warm, self._warm = self._warm, []
        for sandbox in warm:
            sandbox.kill()


_pools: dict[tuple, SandboxPool] = {}
_pools_lock = threading.Lock()


def pool(isolated: bool, limits: Limits, output_limit: int, size: int = 0) -> SandboxPool:
    """The shared pool for these settings (made on first use; grows to ``size`` warm sandboxes)."""
    key = (isolated, limits, output_limit)
    with _pools_lock:
        found = _pools.get(key)
        if found is None or found.closed:
            found = _pools[key] = SandboxPool(isolated, limits, output_limit, size)
        elif size > found._size:
            found.resize(size)
        return found


def close_pools() -> None:
    """Kill every warm sandbox and every sandbox still running (the grader calls it when it is done)."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for found in pools:
        found.close()
    for sandbox in list(_live):
        sandbox.kill()


atexit.register(close_pools)


def describe_settings(limits: Limits) -> str:
    """A line for reports: the limits in words."""
    return json.dumps({"memory_bytes": limits.memory, "processes": limits.processes, "tmpfs_bytes": limits.tmpfs,
                       "cpu_seconds": limits.cpu_seconds})
