"""One memory limit per sandbox, children and shared memory included: a memory cgroup.

``RLIMIT_AS`` caps each process's address space, but a learner's code can fork children (each with its own
limit) and fill shared memory (``/dev/shm``, which belongs to no process). A memory cgroup counts every
page the sandbox's processes use, shared memory (tmpfs) included, and the kernel's OOM killer acts inside
it only, so a sandbox can never take more than its limit from the host. Two kinds are supported:

- **cgroup v1** (the ``memory`` controller mounted on its own, writable as root: this project's
  machines): a child folder of the grader's own memory cgroup per sandbox, with ``memory.limit_in_bytes``
  (and ``memory.memsw.limit_in_bytes`` where swap is accounted); the sandbox's first process enters it
  before it runs anything (in the child, before ``exec``), so everything it starts is inside;
- **cgroup v2 with systemd delegation** (current distributions): the sandbox runs under
  ``systemd-run [--user] --scope -p MemoryMax=... -p MemorySwapMax=0``, a transient scope of its own.

:func:`cgroup_support` says which one works here (probed once); where neither does, the grader goes on
with the per-process limits and says so (:func:`fallback_message`). As root, the sandbox's IPC namespace
also gets ``kernel.shm*`` limits (:func:`limit_shared_memory`): System V segments outlive the process
that made them, so they are capped where they are made.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MemoryCgroup", "cgroup_support", "create", "fallback_message", "limit_shared_memory", "systemd_prefix"]

_counter = itertools.count()
_lock = threading.Lock()
_support: dict[str, tuple[str, str]] = {}


def _v1_base() -> Path | None:
    """The grader's own cgroup folder under the v1 memory controller, if that is mounted and writable."""
    mount = None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                if " - cgroup " in line and "memory" in line.split()[-1].split(","):
                    mount = fields[4]
                    break
        own = ""
        with open("/proc/self/cgroup", encoding="utf-8") as groups:
            for line in groups:
                number, controllers, path = line.rstrip("\n").split(":", 2)
                if "memory" in controllers.split(","):
                    own = path
    except (OSError, ValueError):
        return None
    if mount is None:
        return None
    base = Path(mount) / own.lstrip("/")
    return base if (base / "memory.limit_in_bytes").exists() and os.access(base, os.W_OK) else None


def systemd_prefix(limit: int) -> list[str]:
    """The ``systemd-run`` words that run a command in a transient scope limited to ``limit`` bytes."""
    command = [shutil.which("systemd-run") or "systemd-run"]
    if os.geteuid() != 0:
        command.append("--user")
    return command + ["--scope", "--quiet", "--collect", "-p", f"MemoryMax={limit}", "-p", "MemorySwapMax=0", "--"]


def cgroup_support() -> tuple[str, str]:
    """``("v1", folder)``, ``("systemd", "")`` or ``("none", why)``: how sandboxes get their memory cgroup
    here (probed once per process)."""
    with _lock:
        if "result" not in _support:
            base = _v1_base()
            if base is not None:
                _support["result"] = ("v1", str(base))
            elif Path("/sys/fs/cgroup/cgroup.controllers").exists() and shutil.which("systemd-run"):
                try:
                    probe = subprocess.run([*systemd_prefix(64 * 1024**2), "true"], capture_output=True, timeout=30)
                    _support["result"] = ("systemd", "") if probe.returncode == 0 else (
                        "none", "systemd-run cannot start a scope here: "
                                + probe.stderr.decode(errors="replace").strip()[:200])
                except (OSError, subprocess.SubprocessError) as exc:
                    _support["result"] = ("none", f"systemd-run failed ({exc})")
            else:
                _support["result"] = ("none", "no writable cgroup v1 memory controller and no cgroup v2 with "
                                              "systemd-run")
        return _support["result"]


def fallback_message() -> str | None:
    """A warning for the instructor when sandboxes get no memory cgroup here, else ``None``."""
    kind, why = cgroup_support()
    if kind != "none":
        return None
    return (f"warning: no memory cgroup for the sandboxes ({why}); each learner process is still limited, but "
            "a notebook's children and shared memory are not counted together. Run the grader as root on a "
            "machine with the cgroup v1 memory controller, or under systemd with cgroup v2 delegation.")


@dataclass
class MemoryCgroup:
    """A v1 memory cgroup made for one sandbox (see :func:`create`)."""

    path: Path
    limit: int

    def enter(self) -> None:
        """Move the calling process into the cgroup (in the sandbox's first process, before ``exec``)."""
        with open(self.path / "cgroup.procs", "w", encoding="ascii") as procs:
            procs.write(str(os.getpid()))

    def pids(self) -> list[int]:
        try:
            return [int(pid) for pid in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def peak(self) -> int | None:
        """The most memory the cgroup's processes used at once, in bytes."""
        try:
            return int((self.path / "memory.max_usage_in_bytes").read_text())
        except (OSError, ValueError):
            return None

    def oom_kills(self) -> int:
        """How many times the limit was hit (``memory.failcnt``)."""
        try:
            return int((self.path / "memory.failcnt").read_text())
        except (OSError, ValueError):
            return 0

    def remove(self, timeout: float = 10.0) -> None:
        """SIGKILL every process still in the cgroup (wherever it moved in the PID namespaces), then
        remove the folder."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.02)
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.05)


def limit_shared_memory(pid: int, limit: int) -> bool:
    """Set ``kernel.shmmax``, ``shmall`` and ``shmmni`` in the IPC namespace of process ``pid`` (a
    sandbox's first process: its namespace is the sandbox's own), so that System V shared memory there
    cannot exceed ``limit`` bytes in all. As root only (``nsenter``); whether it worked."""
    nsenter = shutil.which("nsenter")
    if os.geteuid() != 0 or nsenter is None:
        return False
    script = (f"echo {limit} > /proc/sys/kernel/shmmax && echo {max(1, limit // 4096)} > /proc/sys/kernel/shmall "
              "&& echo 64 > /proc/sys/kernel/shmmni")
    try:
        done = subprocess.run([nsenter, f"--ipc=/proc/{pid}/ns/ipc", "--", "/bin/sh", "-c", script],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def create(limit: int) -> MemoryCgroup | None:
    """A fresh v1 memory cgroup limited to ``limit`` bytes (swap included where accounted), or ``None``
    where v1 is not what this machine offers (see :func:`cgroup_support`)."""
    kind, base = cgroup_support()
    if kind != "v1":
        return None
    path = Path(base) / f"attention-course-grading-{os.getpid()}-{next(_counter)}"
    try:
        path.mkdir()
        (path / "memory.limit_in_bytes").write_text(str(limit))
    except OSError:
        try:
            path.rmdir()
        except OSError:
            pass
        return None
    try:  # swap too, where the kernel accounts it (else the limit above holds for RAM only)
        (path / "memory.memsw.limit_in_bytes").write_text(str(limit))
    except OSError:
        pass
    return MemoryCgroup(path, limit)
