"""Start worker processes quickly: a fork server with torch already imported.

Importing torch takes a second or more, far longer than checking a notebook. So on Linux the grader keeps
one *launcher* per grading thread: a fresh Python process that imports torch and the exercise modules
once, runs no learner code itself, and forks a new worker process for every job. Each worker:

- starts its own session (so that killing its process group also kills anything it started);
- has stdin from ``/dev/null`` and stdout/stderr written to ``JOB_DIR/output.log``;
- closes every other file descriptor it inherited, including the launcher's pipes to the grader;
- runs ``attention_course.grading.worker.run`` and exits with ``os._exit``.

The launcher reports each worker's pid and, once it has reaped it, its exit status. If the learner's
code kills the launcher, the grader notices the closed pipe and starts a new launcher for the next job.
Elsewhere (or with ``ATTENTION_COURSE_GRADING_FORK=0``) workers start as ordinary subprocesses, which is
slower but equivalent: see :func:`start_worker`.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["OUTPUT_LOG", "STATUS_LOST", "WorkerProcess", "kill_group", "start_worker", "worker_env"]

OUTPUT_LOG = "output.log"
STATUS_LOST = -(2**16)  # exit status of a worker whose launcher died before reporting it


def worker_env() -> dict[str, str]:
    """The environment of worker (and launcher) processes: this very package first on the path, one thread."""
    import attention_course

    env = dict(os.environ)
    package_root = str(Path(attention_course.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"})
    return env


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (a worker and everything it started)."""
    try:
        if hasattr(os, "killpg"):
            os.killpg(pid, signal.SIGKILL)
        else:  # pragma: no cover - Windows
            os.kill(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def _running(pid: int) -> bool:
    """Whether ``pid`` is still running (not gone, not a zombie), for a process that is not our child."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


class WorkerProcess:
    """A running worker: ``poll()`` gives its exit status (``None`` while it runs), ``kill()`` ends it."""

    def __init__(self, pid: int, poll: Any) -> None:
        self.pid = pid
        self._poll = poll

    def poll(self) -> int | None:
        return self._poll()

    def kill(self) -> None:
        kill_group(self.pid)


# --- the launcher process -----------------------------------------------------------------------------
def _close_inherited_fds(keep: set[int]) -> None:
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _child(job_dir: str) -> None:
    """In the forked worker: detach, redirect, run the job, and never return."""
    code = 1
    try:
        os.setsid()
        os.chdir(job_dir)
        log = os.open(os.path.join(job_dir, OUTPUT_LOG), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        _close_inherited_fds({0, 1, 2})
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        from attention_course.grading.worker import run

        code = run(Path(job_dir))
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve() -> None:
    """The launcher's loop: read job folders on stdin, fork a worker for each, report pids and exits."""
    import torch  # noqa: F401 - imported once here, inherited by every worker

    from attention_course.grading.exercises import exercise_ids, get_exercise
    from attention_course.grading.worker import run  # noqa: F401

    for exercise_id in exercise_ids():
        try:
            get_exercise(exercise_id)  # preloaded for speed; a broken module only fails its own jobs
        except Exception:
            pass

    def say(line: str) -> None:
        os.write(1, (line + "\n").encode())

    say("ready")
    children: set[int] = set()
    pending = b""
    while True:
        readable, _, _ = select.select([0], [], [], 0.02)
        if readable:
            chunk = os.read(0, 65536)
            if not chunk:  # the grader is gone: so is every job
                for pid in children:
                    kill_group(pid)
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                job_dir = line.decode()
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(job_dir)
                children.add(pid)
                say(f"pid {pid} {job_dir}")
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            say(f"exit {pid} {os.waitstatus_to_exitcode(status)}")


# --- the grader's side --------------------------------------------------------------------------------
class _Launcher:
    """The grader's handle on one launcher process."""

    def __init__(self, startup_timeout: float) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "attention_course.grading.launcher"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=worker_env(), start_new_session=True,
        )
        self._lock = threading.Condition()
        self._pids: dict[str, int] = {}
        self._exits: dict[int, int] = {}
        self._ready = False
        self.alive = True
        threading.Thread(target=self._read, daemon=True).start()
        with self._lock:
            self._lock.wait_for(lambda: self._ready or not self.alive, timeout=startup_timeout)
        if not self._ready:
            self.close()
            raise RuntimeError("the grading launcher did not start")

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for raw in self._proc.stdout:
            words = raw.decode(errors="replace").split(" ", 2)
            with self._lock:
                if words[0].strip() == "ready":
                    self._ready = True
                elif words[0] == "pid" and len(words) == 3 and words[1].isdigit():
                    self._pids[words[2].rstrip("\n")] = int(words[1])
                elif words[0] == "exit" and len(words) == 3 and words[1].isdigit():
                    self._exits[int(words[1])] = int(words[2])
                self._lock.notify_all()
        with self._lock:
            self.alive = False
            self._lock.notify_all()

    def start(self, job_dir: Path, timeout: float) -> WorkerProcess:
        key = str(job_dir)
        assert self._proc.stdin is not None
        self._proc.stdin.write((key + "\n").encode())
        self._proc.stdin.flush()
        with self._lock:
            self._lock.wait_for(lambda: key in self._pids or not self.alive, timeout=timeout)
            pid = self._pids.pop(key, None)
        if pid is None:
            raise RuntimeError("the grading launcher did not start the worker")

        def poll() -> int | None:
            with self._lock:
                if pid in self._exits:
                    return self._exits.pop(pid)
                if not self.alive and not _running(pid):  # the launcher died (killed by this worker?)
                    return STATUS_LOST
                return None

        return WorkerProcess(pid, poll)

    def close(self) -> None:
        self.alive = False
        kill_group(self._proc.pid)
        self._proc.wait()


_local = threading.local()


def _launcher(startup_timeout: float) -> _Launcher:
    launcher = getattr(_local, "launcher", None)
    if launcher is None or not launcher.alive or launcher._proc.poll() is not None:
        if launcher is not None:
            launcher.close()
        launcher = _local.launcher = _Launcher(startup_timeout)
    return launcher


def _use_fork() -> bool:
    return sys.platform == "linux" and os.environ.get("ATTENTION_COURSE_GRADING_FORK", "1") != "0"


def start_worker(job_dir: Path, startup_timeout: float) -> WorkerProcess:
    """Start a worker on ``job_dir`` (forked from this thread's launcher on Linux, else a subprocess);
    its output goes to ``job_dir/output.log``."""
    if _use_fork():
        for _ in range(2):  # a launcher killed by the previous job is replaced once
            try:
                return _launcher(startup_timeout).start(job_dir, timeout=startup_timeout)
            except (RuntimeError, OSError):
                time.sleep(0.1)
    with open(job_dir / OUTPUT_LOG, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "attention_course.grading.worker", str(job_dir)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            cwd=job_dir, env=worker_env(), start_new_session=True,
        )
    return WorkerProcess(proc.pid, proc.poll)


if __name__ == "__main__":
    _serve()
