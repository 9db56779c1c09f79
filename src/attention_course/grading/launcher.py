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

The notebook check uses a :class:`Zygote` instead (through a :class:`ZygotePool`): one sandbox per kernel
whose worker imports once and forks a fresh process per check (a :class:`ForkedWorker`, watched exactly as a
:class:`Sandbox` is), since a learner's checks come one after another from one notebook. The grader never
does: every notebook attempt it makes gets a sandbox of its own.

Without isolation (``isolated=False``, the grader's ``--no-sandbox``), the same worker runs as a plain
``python -I -B`` process in a session of its own, with the same rlimits, but with the instructor's rights.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from attention_course.grading import memory_cgroup, package_view
from attention_course.grading.channel import FrameReader, parse_header
from attention_course.grading.isolation import (
    SANDBOX_UID_BASE,
    Limits,
    _set_pdeathsig,
    package_root,
    sandbox_command,
    sandbox_mode,
    seccomp_fd,
    worker_environment,
)
from attention_course.grading.worker import bootstrap_source

__all__ = ["ForkedWorker", "OUTPUT_LOG", "STATUS_LOST", "Sandbox", "SandboxPool", "Zygote", "ZygotePool",
           "close_pools", "kill_group", "pool", "sandbox_uids", "zygote_pool"]

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

    def __init__(self, isolated: bool, limits: Limits, output_limit: int, zygote: bool = False) -> None:
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
        # The package as this sandbox sees it: the worker's modules, then the job's (package_view).
        self.view = package_view.new_view(self.dir) if isolated else None
        self._uid = _uids.take() if isolated and os.geteuid() == 0 and sandbox_mode() == "root" else None
        self._killed = False
        self.peak_memory: int | None = None  # bytes, from the memory cgroup, once killed
        self.shared_memory_limited: bool | None = None  # kernel.shm* set in its IPC namespace (as root)
        self._limits = limits
        self.control: socket.socket | None = None
        if zygote:  # a control socket (file descriptors travel on it) instead of the channel pipe
            self.control, inner = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            read_end, write_end = -1, inner.detach()
        else:
            read_end, write_end = os.pipe()
        settings = {
            # Every file, the output log included, stops one byte past the output limit (RLIMIT_FSIZE).
            "file_size": output_limit + 1,
            "processes": limits.processes,
            "cpu_seconds": limits.cpu_seconds,
            "memory": limits.memory,
            "zygote": zygote,
            "own_pid_namespace": isolated,  # the zygote may kill(-1) after a job only in a PID namespace of its own
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

        seccomp = seccomp_fd() if isolated else None  # no new user namespace inside (read by bwrap)
        try:
            if isolated:
                command = sandbox_command(argv, uid=self._uid, limits=limits, seccomp=seccomp, view=self.view)
                if cgroup is None and memory_cgroup.cgroup_support()[0] == "systemd":
                    command = memory_cgroup.systemd_prefix(limits.cgroup_limit) + command
                env = worker_environment()
            else:
                command, env = argv, worker_environment()
            self._proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log, stderr=log, env=env,
                                          pass_fds=(write_end,) if seccomp is None else (write_end, seccomp),
                                          start_new_session=True,
                                          cwd=self.dir if not isolated else "/", preexec_fn=before_exec)
        except BaseException:
            if read_end >= 0:
                os.close(read_end)
            if self.control is not None:
                self.control.close()
            if self.cgroup is not None:
                self.cgroup.remove()
            self._cleanup_files()
            raise
        finally:
            os.close(write_end)
            os.close(log)
            if seccomp is not None:
                os.close(seccomp)
        self.pid = self._proc.pid
        self.channel = (FrameReader(read_end, max_frames=1, max_bytes=CHANNEL_LIMIT, blob_limit=BLOB_LIMIT)
                        if read_end >= 0 else None)
        _live.add(self)

    # --- starting -----------------------------------------------------------------------------------
    def wait_ready(self, timeout: float) -> bool:
        """Whether the worker said ``ready`` (imports done, no learner code run yet) within ``timeout``."""
        assert self.channel is not None, "a zygote's jobs say ready on their own channels"
        ready = _said_ready(self.channel, timeout)
        if ready:
            self.limit_shared_memory()
        return ready

    def limit_shared_memory(self) -> None:
        """Cap System V shared memory in the sandbox's IPC namespace (once, as root; see memory_cgroup)."""
        if self.isolated and self.shared_memory_limited is None:
            inside = _children(self.pid)  # the sandbox's first process: its IPC namespace is the sandbox's
            self.shared_memory_limited = bool(inside) and memory_cgroup.limit_shared_memory(
                inside[0], self._limits.cgroup_limit)

    def send_job(self, job_bytes: bytes, max_frames: int) -> None:
        """Give the worker its job (once). Writes from a thread: a worker that stopped reading cannot block
        the grader."""
        assert self.channel is not None and self._proc.stdin is not None
        _send_job(self.channel, self._proc.stdin, job_bytes, max_frames)

    # --- watching -----------------------------------------------------------------------------------
    def poll(self) -> int | None:
        return self._proc.poll()

    def output_size(self) -> int:
        return _size(self.log)

    def output_tail(self, size: int = 2000) -> str:
        return _tail(self.log, size)

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
            if self.channel is not None:
                self.channel.join(5)
            if self.control is not None:
                self.control.close()
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


def _said_ready(channel: FrameReader, timeout: float) -> bool:
    """Whether the first frame on ``channel``, within ``timeout``, is the worker's ``ready``."""
    channel.wait(1, timeout)
    frames = channel.take(0)
    return bool(frames) and (parse_header(frames[0]) or {}).get("step") == "ready"


def _send_job(channel: FrameReader, stdin: Any, job_bytes: bytes, max_frames: int) -> None:
    channel.allow(max_frames + 1)  # + the ready frame

    def write() -> None:
        try:
            stdin.write(job_bytes)
            stdin.close()
        except (OSError, ValueError):
            pass

    threading.Thread(target=write, daemon=True).start()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _tail(path: Path, size: int) -> str:
    try:
        with open(path, "rb") as log:
            log.seek(max(0, _size(path) - size))
            return log.read(size).decode("utf-8", errors="replace")
    except OSError:
        return ""


class Zygote:
    """A sandbox whose worker imports PyTorch and the exercises once, then forks a fresh process per job:
    the notebook check's worker (a learner's checks one after another, one notebook, one kernel). Each
    :meth:`fork` is a :class:`ForkedWorker`: a job of its own, with its own stdin, channel and output log.
    Between jobs the zygote kills everything the last one left in the sandbox and removes what it left in
    ``/tmp`` (see :mod:`attention_course.grading.worker`). A job that does not end cleanly (exit status 0)
    takes the whole sandbox with it: the next check starts a new one. The grader itself never uses a
    zygote: it gives every notebook attempt a sandbox of its own.

    Args:
        isolated, limits, output_limit: as for :class:`Sandbox`.
    """

    def __init__(self, isolated: bool, limits: Limits, output_limit: int) -> None:
        self.sandbox = Sandbox(isolated, limits, output_limit, zygote=True)
        self.isolated = isolated
        self.jobs = 0
        self.owner: ZygotePool | None = None  # gets the zygote back after a clean job

    def alive(self) -> bool:
        return not self.sandbox._killed and self.sandbox.poll() is None

    def fork(self) -> ForkedWorker:
        """Start the next job's process (the zygote forks it once its imports are done)."""
        self.jobs += 1
        return ForkedWorker(self, self.sandbox.dir / f"job-{self.jobs}.log")

    def read_message(self, timeout: float = 0.0) -> bytes | None:
        """The zygote's next message (``ready``, ``exit <status>``; ``b""`` once it closed the socket), or
        ``None`` if none came within ``timeout``."""
        control = self.sandbox.control
        assert control is not None
        if not select.select([control], [], [], timeout)[0]:
            return None
        try:
            return control.recv(64)
        except OSError:
            return b""

    def kill(self) -> None:
        self.sandbox.kill()


class ForkedWorker:
    """One job of a :class:`Zygote`, used by the sandbox module exactly as a :class:`Sandbox` is."""

    def __init__(self, zygote: Zygote, log: Path) -> None:
        self.zygote = zygote
        self.isolated = zygote.isolated
        self.view = zygote.sandbox.view  # refilled for each job (jobs of a zygote come one at a time)
        self.log = log
        self.peak_memory: int | None = None
        self._code: int | None = None
        self._killed = False
        job_read, job_write = os.pipe()
        channel_read, channel_write = os.pipe()
        log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            control = zygote.sandbox.control
            assert control is not None
            socket.send_fds(control, [b"job"], [job_read, channel_write, log_fd])
        except BaseException:
            for fd in (job_write, channel_read):
                os.close(fd)
            raise
        finally:
            for fd in (job_read, channel_write, log_fd):
                os.close(fd)
        self._stdin = os.fdopen(job_write, "wb")
        self.channel = FrameReader(channel_read, max_frames=1, max_bytes=CHANNEL_LIMIT, blob_limit=BLOB_LIMIT)

    def wait_ready(self, timeout: float) -> bool:
        ready = _said_ready(self.channel, timeout)
        if ready:
            self.zygote.sandbox.limit_shared_memory()
        return ready

    def send_job(self, job_bytes: bytes, max_frames: int) -> None:
        _send_job(self.channel, self._stdin, job_bytes, max_frames)

    def poll(self) -> int | None:
        """The job's exit status, as the zygote reports it once it cleaned up after the job (``None`` while
        it runs; ``STATUS_LOST`` when the zygote itself is gone)."""
        while self._code is None:
            message = self.zygote.read_message()
            if message is None and self.zygote.sandbox.poll() is not None:
                message = self.zygote.read_message() or b""  # a report sent just before it ended
            if message is None:
                break
            if message.startswith(b"exit "):
                try:
                    self._code = int(message[5:])
                except ValueError:
                    self._code = STATUS_LOST
            elif message != b"ready":  # b"": the zygote is gone
                self._code = STATUS_LOST
        return self._code

    def output_size(self) -> int:
        return _size(self.log)

    def output_tail(self, size: int = 2000) -> str:
        return _tail(self.log, size)

    def kill(self) -> None:
        """End the job; the zygote survives only a job that ended cleanly (idempotent)."""
        if self._killed:
            return
        self._killed = True
        try:
            if self.poll() != 0 or not self.zygote.alive():
                self.zygote.kill()
            self.channel.join(5)
            try:
                self._stdin.close()
            except OSError:
                pass
        finally:
            sandbox = self.zygote.sandbox
            # The sandbox's peak since the zygote started (its own imports included, as a worker's are).
            alive = not sandbox._killed and sandbox.cgroup is not None
            self.peak_memory = sandbox.cgroup.peak() if alive and sandbox.cgroup is not None else sandbox.peak_memory
            try:
                self.log.unlink()
            except OSError:
                pass
            if self.zygote.owner is not None:
                self.zygote.owner.give_back(self.zygote)


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


class ZygotePool:
    """The notebook check's workers: a :class:`Zygote` kept between checks, so that each check forks a fresh
    process instead of starting Python and importing PyTorch again. :meth:`take` hands out a job of an idle
    zygote (starting one if there is none) and takes the zygote back once the job ended cleanly.

    Args:
        isolated, limits, output_limit: as for :class:`Sandbox`.
    """

    def __init__(self, isolated: bool, limits: Limits, output_limit: int) -> None:
        self._key = (isolated, limits, output_limit)
        self._lock = threading.Lock()
        self._idle: list[Zygote] = []
        self.closed = False

    def _idle_zygote(self) -> Zygote:
        while True:
            with self._lock:
                if self.closed:
                    raise RuntimeError("the sandbox pool is closed")
                zygote = self._idle.pop() if self._idle else None
            if zygote is None:
                zygote = Zygote(*self._key)
                zygote.owner = self
                return zygote
            if zygote.alive():
                return zygote
            zygote.kill()

    def take(self, refill: bool = True) -> ForkedWorker:
        """A fresh process for one job (``refill`` is accepted for :class:`SandboxPool`'s sake: the zygote
        stays)."""
        for tries_left in (1, 0):
            zygote = self._idle_zygote()
            try:
                return zygote.fork()
            except OSError:  # the zygote died while idle (its socket is closed): start another
                zygote.kill()
                if not tries_left:
                    raise
        raise AssertionError("unreachable")

    def give_back(self, zygote: Zygote) -> None:
        with self._lock:
            keep = not self.closed and zygote.alive() and zygote not in self._idle
            if keep:
                self._idle.append(zygote)
        if not keep:
            zygote.kill()

    def fill(self) -> None:
        """Start a zygote now (without waiting for its imports) unless one is idle."""
        with self._lock:
            if self.closed or self._idle:
                return
        zygote = Zygote(*self._key)
        zygote.owner = self
        self.give_back(zygote)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
        for zygote in idle:
            zygote.kill()


_pools: dict[tuple, SandboxPool | ZygotePool] = {}
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
        assert isinstance(found, SandboxPool)
        return found


def zygote_pool(isolated: bool, limits: Limits, output_limit: int) -> ZygotePool:
    """The shared :class:`ZygotePool` for these settings (made on first use)."""
    key = ("zygote", isolated, limits, output_limit)
    with _pools_lock:
        found = _pools.get(key)
        if found is None or found.closed:
            found = _pools[key] = ZygotePool(isolated, limits, output_limit)
        assert isinstance(found, ZygotePool)
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
