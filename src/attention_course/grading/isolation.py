"""Operating-system isolation for learners' code: bubblewrap, resource limits and safe reading.

The grader runs each notebook's graded cells in a fresh **sandbox** (see
:mod:`attention_course.grading.launcher`): a ``bwrap`` (bubblewrap) process that gives the worker

- new PID, network, IPC and UTS namespaces (no network, no view of other processes, killed as one when
  the grader kills it: ``--die-with-parent``, ``--new-session``);
- a filesystem made only of read-only binds of what Python needs (``/usr``, the Python installation, the
  virtual environment) and a private, size-capped tmpfs at ``/tmp`` as its only writable place; at the
  course package's path, a view of it holding only the modules the job may use
  (:mod:`attention_course.grading.package_view`; without a view, the package's source folder). The
  submissions, the solution notebooks, the grades, the instructor's home and the rest of the repository
  do not exist inside;
- an unprivileged user: as root (with CAP_SYS_ADMIN: the ``"root"`` mode), the grader hands the sandbox a
  uid of its own (so the process limit counts that sandbox only); otherwise (not root, or root without
  CAP_SYS_ADMIN as in a container with Docker's default capabilities: the ``"userns"`` mode, see
  :func:`check_sandbox`) bubblewrap's user namespace maps the grader's uid, with ``--disable-userns``;
- a seccomp filter (:func:`userns_filter`, ``bwrap --seccomp``) in every mode: no process in the sandbox
  can make a new user namespace (``unshare``/``clone`` with ``CLONE_NEWUSER``, ``setns``, ``clone3``, or
  system calls of another ABI), so learner code never gets root or capabilities in a namespace of its own;
- resource limits it cannot raise (:class:`Limits`): address space, processes, file size, CPU time, no
  core dumps, and ``no_new_privs``; file size (``RLIMIT_FSIZE``) is the output limit plus one byte; the
  grader adds a wall clock per step and per notebook, and watches the output.

This module also reads submissions safely (:func:`read_submission`) and strips control characters from
anything the grader prints or writes (:func:`clean_text`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "INSTALL_HINT",
    "Limits",
    "SANDBOX_BASELINE",
    "SandboxUnavailable",
    "Snapshot",
    "bwrap_path",
    "check_sandbox",
    "sandbox_mode",
    "seccomp_fd",
    "userns_filter",
    "clean_text",
    "read_submission",
    "sandbox_command",
    "worker_environment",
]

#: How to get bubblewrap, for the message of a grader that cannot isolate learners' code.
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `sudo apt-get install bubblewrap`, or `make grader-deps`), "
                "or pass --no-sandbox to run learners' code UNISOLATED, with your own rights (not for real classes)")

_CONTROL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI sequences (colours, cursor movement)
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC sequences (titles, hyperlinks)
    r"|\x1b.?|[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # other escapes and control characters
)


def clean_text(text: object, limit: int | None = None) -> str:
    """``text`` on one line, without ANSI escapes or control characters (so that nothing the learner's
    code wrote can move the cursor or forge a line of the report), cut to ``limit`` characters."""
    cleaned = _CONTROL.sub("", str(text).replace("\t", " ").replace("\r\n", "\n").replace("\n", " "))
    cleaned = cleaned.replace("\u2028", " ").replace("\u2029", " ").replace("\u202e", "").replace("\u202d", "")
    if limit is not None and len(cleaned) > limit:
        cleaned = cleaned[: max(0, limit - 3)] + "..."
    return cleaned


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or does not work here; the message says how to install it."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one worker process (a sandbox), none of which the learner's code can raise.

    Attributes:
        memory: bytes of address space the learner's code may add to what Python and torch use after
            start-up (``RLIMIT_AS``).
        processes: processes and threads (``RLIMIT_NPROC``; per sandbox: its own uid or user namespace).
        tmpfs: bytes of the sandbox's private ``/tmp``.
        cpu_seconds: CPU time of the whole process (``RLIMIT_CPU``), a backstop for the wall clock.
        sandbox_memory: bytes of memory the whole sandbox may use, every process and shared memory
            included (a memory cgroup, ``attention_course.grading.memory_cgroup``); ``None``: ``memory``
            plus :data:`SANDBOX_BASELINE` (what Python and torch use after start-up).
    """

    memory: int = 2 * 1024**3
    processes: int = 64
    tmpfs: int = 64 * 1024**2
    cpu_seconds: int = 600
    sandbox_memory: int | None = None

    @property
    def cgroup_limit(self) -> int:
        """The memory cgroup's limit, ``sandbox_memory``, or else ``memory`` plus ``SANDBOX_BASELINE``."""
        return self.sandbox_memory if self.sandbox_memory is not None else self.memory + SANDBOX_BASELINE


#: Memory a worker uses after start-up (Python, torch, the exercise modules), added to ``Limits.memory``
#: for the sandbox's memory cgroup.
SANDBOX_BASELINE = 1024**3


def bwrap_path() -> str | None:
    """The bubblewrap executable, or ``None``."""
    return shutil.which("bwrap") or next((p for p in ("/usr/bin/bwrap", "/bin/bwrap") if os.access(p, os.X_OK)),
                                         None)


_checked: dict[str, str | None] = {}
_check_lock = threading.Lock()


def _probe(mode: str) -> str | None:
    """Why a sandbox of this ``mode`` cannot start here (``true`` run in it), or ``None`` when it can."""
    import subprocess

    fd = seccomp_fd()
    try:
        command = sandbox_command([_true_path()], uid=_free_uid_probe() if mode == "root" else None, seccomp=fd,
                                  mode=mode)
        probe = subprocess.run(command, capture_output=True, timeout=60, env=worker_environment(),
                               preexec_fn=_set_pdeathsig, pass_fds=() if fd is None else (fd,))
    except (OSError, subprocess.SubprocessError) as exc:
        return clean_text(exc, 300)
    finally:
        if fd is not None:
            os.close(fd)
    return None if probe.returncode == 0 else clean_text(probe.stderr.decode(errors="replace"), 300) or \
        f"exit status {probe.returncode}"


def check_sandbox(hint: str | None = None) -> None:
    """Raise :class:`SandboxUnavailable` unless bubblewrap is installed and can start a sandbox here
    (checked once per process, by starting ``true`` in the same kind of sandbox the workers get). As root
    it tries the ``"root"`` mode first (no user namespace; needs CAP_SYS_ADMIN), then a user namespace (root
    without CAP_SYS_ADMIN, as in a container with Docker's default capabilities); :func:`sandbox_mode` then
    says which one works.

    Args:
        hint: what to do about it, for the message (default :data:`INSTALL_HINT`, which names the
            grader's own options; another command passes words about its own).
    """
    hint = hint or INSTALL_HINT
    with _check_lock:
        if "result" not in _checked:
            path = bwrap_path()
            if path is None:
                _checked["result"] = "bubblewrap (bwrap) is not installed"
            else:
                modes = ["root", "userns"] if os.geteuid() == 0 else ["userns"]
                problems = []
                for mode in modes:
                    problem = _probe(mode)
                    if problem is None:
                        _mode["mode"] = mode
                        break
                    problems.append(f"{mode}: {problem}")
                _checked["result"] = None if "mode" in _mode else \
                    f"bubblewrap cannot start a sandbox here ({'; '.join(problems)}){_CONTAINER_NOTE}"
        problem = _checked["result"]
    if problem:
        raise SandboxUnavailable(f"{problem}; {hint}")


_CONTAINER_NOTE = (" (in a container with Docker's defaults, its seccomp profile forbids the namespaces bubblewrap "
                   "makes and its masked /proc paths forbid a new /proc: see chapters/instructors.md for what the "
                   "container must allow)")


def _true_path() -> str:
    return shutil.which("true") or "/bin/true"


def _free_uid_probe() -> int:
    return SANDBOX_UID_BASE


# --- what the sandbox sees ----------------------------------------------------------------------------
#: First uid handed to sandboxes when the grader runs as root (one uid per live sandbox).
SANDBOX_UID_BASE = 2_000_000_000


def package_root() -> Path:
    """The folder that holds the ``attention_course`` package (``src/`` in a clone, else site-packages)."""
    import attention_course

    return Path(attention_course.__file__).resolve().parents[1]


def _real(path: str | Path) -> str:
    return str(Path(path).resolve())


def _read_only_paths(package: bool = True) -> list[str]:
    """What the worker needs to read: the Python installation, the environment, the course package (with
    ``package=False``, not the package's folder: a view takes its place)."""
    candidates = [sys.base_prefix, sys.prefix, sys.exec_prefix] + ([str(package_root())] if package else [])
    # Where the interpreter's own files really live (a venv's python is a symlink into the base install).
    candidates.append(str(Path(_real(sys.executable)).parents[1]))
    paths: list[str] = []
    for candidate in candidates:
        real = _real(candidate)
        if real == "/" or real in paths:
            continue
        paths.append(real)
        if candidate != real and os.path.abspath(candidate) not in paths:
            paths.append(os.path.abspath(candidate))
    # Drop paths inside another bound path (a venv inside the repo's src? never bind twice).
    paths.sort(key=len)
    kept: list[str] = []
    for path in paths:
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


_SYSTEM = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/ld.so.cache", "/etc/ld.so.conf",
           "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives"]


#: How sandboxes are made here (:func:`sandbox_mode`): ``"root"``: the grader is root with CAP_SYS_ADMIN, no
#: user namespace, and the worker drops to a uid of its own; ``"userns"``: a user namespace (not root, or root
#: without CAP_SYS_ADMIN, as in a container with Docker's default capabilities).
_mode: dict[str, str] = {}


def sandbox_mode() -> str:
    """``"root"`` (root with CAP_SYS_ADMIN, no user namespace, the worker on a uid of its own) or ``"userns"``
    (a user namespace: not root, or root without CAP_SYS_ADMIN): the kind :func:`check_sandbox` found to work here
    (before any check: ``"root"`` as root, else ``"userns"``)."""
    return _mode.get("mode") or ("root" if os.geteuid() == 0 else "userns")


def sandbox_command(argv: list[str], uid: int | None, limits: Limits | None = None, seccomp: int | None = None,
                    mode: str | None = None, view: str | Path | None = None) -> list[str]:
    """The ``bwrap`` command line that runs ``argv`` in a fresh sandbox (see the module docstring).

    Args:
        argv: the command to run inside (absolute paths).
        uid: in the ``"root"`` mode, the sandbox's own uid (the worker drops to it); else ``None``.
        limits: sizes (the tmpfs); the rlimits are applied by the worker itself.
        seccomp: a file descriptor holding :func:`userns_filter` (:func:`seccomp_fd`), passed to bwrap with
            the command: no process in the sandbox can make a user namespace.
        mode: ``"root"`` or ``"userns"`` (default :func:`sandbox_mode`).
        view: a folder bound read-only at the package's path (``<package root>/attention_course``) in place of
            the package (:mod:`attention_course.grading.package_view`); ``None``: the whole package.
    """
    limits = limits or Limits()
    path = bwrap_path()
    if path is None:
        raise SandboxUnavailable(f"bubblewrap (bwrap) is not installed; {INSTALL_HINT}")
    command = [path, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
               "--die-with-parent", "--new-session", "--clearenv", "--hostname", "sandbox"]
    if (mode or sandbox_mode()) == "root":
        # No user namespace: the worker drops from root to its own uid (so RLIMIT_NPROC binds; root is exempt).
        command += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        command += ["--unshare-user"] + (["--disable-userns"] if _supports(path, "--disable-userns") else [])
    if seccomp is not None:
        command += ["--seccomp", str(seccomp)]
    for system in _SYSTEM:
        if os.path.islink(system):
            command += ["--symlink", os.readlink(system), system]
        elif os.path.exists(system):
            command += ["--ro-bind", system, system]
    command += ["--proc", "/proc", "--dev", "/dev"]
    # The private /tmp comes before the read-only binds: a course installed under /tmp (a fresh clone in a
    # temporary folder, say) is then bound on top of it instead of being hidden by it.
    if _supports(path, "--size"):  # bubblewrap >= 0.8; older ones give an unbounded private /tmp
        command += ["--size", str(limits.tmpfs), "--perms", "1777", "--tmpfs", "/tmp"]
    else:
        command += ["--tmpfs", "/tmp", "--chmod", "1777", "/tmp"]
    bound = _read_only_paths() if view is None else _read_only_paths(package=False)
    target = str(package_root() / "attention_course")
    parents = sorted({str(parent) for path in [*bound, *([target] if view is not None else [])]
                      for parent in Path(path).parents} - {"/", "/tmp"}, key=lambda p: p.count("/"))
    for parent in parents:  # made by bwrap with mode 0700 otherwise: unreadable once the worker drops root
        command += ["--perms", "0755", "--dir", parent]
    for read_only in bound:
        command += ["--ro-bind", read_only, read_only]
    if view is not None:  # last: over the package where an environment bound above holds it
        command += ["--ro-bind", str(view), target]
    command += ["--chdir", "/tmp"]
    environment = worker_environment()
    if uid is not None:
        environment["ATTENTION_COURSE_SANDBOX_UID"] = str(uid)
    for key, value in environment.items():
        command += ["--setenv", key, value]
    return command + ["--", *argv]


# --- no new user namespaces inside: a seccomp filter ---------------------------------------------------
#: Per architecture (``uname -m``): the kernel's audit arch and the numbers of unshare, clone, clone3, setns.
_SYSCALLS = {
    "x86_64": (0xC000003E, 272, 56, 435, 308),
    "aarch64": (0xC00000B7, 97, 220, 435, 268),
}
_CLONE_NEWUSER = 0x10000000
_X32_BIT = 0x40000000
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_EPERM, _ENOSYS = 1, 38


def userns_filter() -> bytes | None:
    """A seccomp program (classic BPF, as ``bwrap --seccomp`` reads it) that refuses every way to a new user
    namespace: ``unshare`` and ``clone`` with ``CLONE_NEWUSER`` (EPERM), ``setns`` (EPERM), ``clone3`` (ENOSYS,
    whose flags a filter cannot read: the C library then falls back to ``clone``, which is filtered), and
    every system call of another ABI (x32, i386 on x86_64: EPERM). Everything else is allowed. ``None`` on an
    architecture this module does not know."""
    import platform
    import struct

    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        return None
    arch, unshare, clone, clone3, setns = numbers
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    deny, nosys, allow = _RET_ERRNO | _EPERM, _RET_ERRNO | _ENOSYS, _RET_ALLOW
    program = [
        (ld, 0, 0, 4),  # 0: the architecture
        (jeq, 1, 0, arch),  # 1: native -> 3
        (ret, 0, 0, deny),  # 2: another ABI
        (ld, 0, 0, 0),  # 3: the system call's number
        (jge, 0, 1, _X32_BIT),  # 4: x32 -> 5, else 6
        (ret, 0, 0, deny),  # 5
        (jeq, 4, 0, unshare),  # 6: -> 11
        (jeq, 3, 0, clone),  # 7: -> 11
        (jeq, 6, 0, setns),  # 8: -> 15
        (jeq, 6, 0, clone3),  # 9: -> 16
        (ret, 0, 0, allow),  # 10
        (ld, 0, 0, 16),  # 11: the flags (first argument, low 32 bits)
        (jset, 0, 1, _CLONE_NEWUSER),  # 12: CLONE_NEWUSER -> 13, else 14
        (ret, 0, 0, deny),  # 13
        (ret, 0, 0, allow),  # 14
        (ret, 0, 0, deny),  # 15: setns
        (ret, 0, 0, nosys),  # 16: clone3
    ]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


def seccomp_fd() -> int | None:
    """A fresh file descriptor (a memfd, inheritable) holding :func:`userns_filter`, for ``bwrap --seccomp``;
    ``None`` where there is no filter for this architecture. The caller passes it to bwrap and closes it."""
    program = userns_filter()
    if program is None or not hasattr(os, "memfd_create"):
        return None
    fd = os.memfd_create("attention-course-seccomp", 0)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


_help: dict[str, str] = {}


def _supports(path: str, flag: str) -> bool:
    """Whether this bubblewrap knows ``flag`` (its ``--help`` lists it)."""
    if path not in _help:
        import subprocess

        try:
            _help[path] = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            _help[path] = ""
    return flag in _help[path]


def worker_environment() -> dict[str, str]:
    """The allow-listed environment of a worker: nothing of the instructor's (no tokens, no paths)."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": "/tmp/.matplotlib",
        "PYTHONUNBUFFERED": "1",
        "ATTENTION_COURSE_DEVICE": "cpu",
        "ATTENTION_COURSE_STATIC_FIGURES": "1",
    }
    return env


def _set_pdeathsig() -> None:
    """In a child before exec: die when the grader dies (bwrap's --die-with-parent covers the inside)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except Exception:
        pass


# --- reading a submission -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Snapshot:
    """A submission's bytes, read once before any learner code runs, and their sha256."""

    data: bytes
    sha256: str


def read_submission(path: str | Path, max_bytes: int) -> Snapshot | str:
    """Read ``path`` once, safely: a regular file only (no symlink, FIFO, device), at most ``max_bytes``.

    Returns:
        the :class:`Snapshot`, or a message saying why the file was refused. The message never quotes the
        file's contents.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if os.path.islink(path):
            return "the file is a symbolic link, not a notebook (submit the .ipynb file itself)"
        return f"could not open the file ({exc.strerror or type(exc).__name__})"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return "not a regular file (a folder, pipe, device or socket), so not a notebook"
        if info.st_size > max_bytes:
            return f"the notebook is {info.st_size:,} bytes, more than the {max_bytes:,} accepted"
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            return f"the notebook is more than the {max_bytes:,} bytes accepted"
        data = b"".join(chunks)
    except OSError as exc:
        return f"could not read the file ({exc.strerror or type(exc).__name__})"
    finally:
        os.close(fd)
    return Snapshot(data, hashlib.sha256(data).hexdigest())
