"""The learner's side of grading: one process per notebook attempt, inside a sandbox of its own.

The grader starts ``python -I -B -c <bootstrap>`` in a fresh bubblewrap sandbox
(:mod:`attention_course.grading.launcher`, :mod:`attention_course.grading.isolation`) before it knows the
job, so that importing torch overlaps with other work. The worker then:

1. drops root (as root, the sandbox hands it a uid of its own), sets ``no_new_privs`` and the resource
   limits it cannot raise again (processes, file size, CPU time, no core dumps);
2. imports torch and the grading worker's own modules (unisolated, every exercise module too), caps its
   address space at what it uses plus the memory limit, and says ``ready`` on its channel (a pipe the
   grader reads, see :mod:`attention_course.grading.channel`);
3. reads the job (pickled by the grader) from stdin: the exercise's trusted preamble, the learner's graded
   cells and each part's cases (inputs only: references stay in the grader). In a sandbox, the course
   package it sees is a view (:mod:`attention_course.grading.package_view`): until the job, only the
   worker's modules; before sending the job, the grader adds the exercise's module, the modules its cases
   need and those of the library names the job allows, and nothing else, so that no other course module
   can be imported in this process at all; the allowed names are put on the view's minimal package;
4. installs the library rule at run time (``attention_course.grading.import_guard``, defence in depth):
   the course package pruned to what the parts' ``run`` functions need, the names this job's allowance
   (one for all its parts: the grader groups parts by allowance) does not include hidden, ``sys.modules``
   scrubbed, and an audit hook that refuses the other routes to it;
5. runs the preamble and the cells in notebook order in one namespace (errors are recorded, not fatal),
   then calls each part's ``run`` on its cases and sends the wire-form outcomes.

For the notebook check the worker can instead be a **zygote** (``settings["zygote"]``, see
:class:`~attention_course.grading.launcher.Zygote`): after step 2 it forks one child per job it is sent,
each child goes on from step 2 with the job's own stdin, channel and log, and the zygote cleans up after
each child (``_serve_forks``).

Every step is announced on the channel before it starts, so that the grader knows which cell or part to
blame when the process hangs or dies. The worker judges nothing; it cannot see the submissions folder,
the solutions, the grades or the network.
"""

from __future__ import annotations

import builtins
import json
import os
import pickle
import sys
from dataclasses import dataclass
from typing import Any

from attention_course.grading.channel import send_frame
from attention_course.grading.learner_text import to_python

__all__ = ["Job", "STATUS_OUTPUT_LIMIT", "bootstrap_source", "main"]


@dataclass
class Job:
    """What the grader sends: the exercise, the learner's graded cells, and the cases to run.

    Attributes:
        exercise_id: which checks module's parts to use (for their ``run`` functions).
        preamble: trusted source run before the cells.
        cells: ``(cell index in the notebook, part name, source)`` in notebook order.
        parts: ``(part name, cases)`` in the order to run them (cases carry inputs only).
        file_size_limit: unused (kept for compatibility; the sandbox's limits apply).
        output_limit: bytes of output allowed; past it the worker stops before its next step (None: no
            limit of its own, the grader's watch only).
        allowed: names of the course library (``attention_course.<name>``) the learner's code may use, the
            same for every part of the job; ``None``: no restriction.
        library: ``(name, module)`` for each name in ``allowed``: where the worker finds it (in a sandbox, the
            package is a view with a minimal ``__init__``, see :mod:`attention_course.grading.package_view`).
    """

    exercise_id: str
    preamble: str
    cells: list[tuple[int, str, str]]
    parts: list[tuple[str, list[Any]]]
    file_size_limit: int = 100_000_000
    output_limit: int | None = None
    allowed: frozenset[str] | None = None
    library: tuple[tuple[str, str], ...] = ()


#: Exit status of a worker that stopped itself because its output passed the job's ``output_limit``.
STATUS_OUTPUT_LIMIT = 3


def bootstrap_source(package_root: str, channel_fd: int, settings: dict[str, Any]) -> str:
    """The ``python -I -B -c`` source that starts a worker (the package root is bound read-only)."""
    return (f"import sys; sys.path.insert(0, {package_root!r}); "
            f"from attention_course.grading.worker import main; main({channel_fd!r}, {json.dumps(settings)!r})")


class _Channel:
    """Sends one JSON header per step (and result bytes) to the grader; checks the output limit first.

    The grader polls the log only every few milliseconds, and a fast cell can print megabytes and finish
    in less; stopping here keeps the blame on the step that printed, not on whichever step came next.
    """

    def __init__(self, fd: int, log_fd: int) -> None:
        self._fd = fd
        self._log_fd = log_fd  # a private duplicate of the output log: the learner may redirect fd 1
        self.output_limit: int | None = None

    def _output_size(self) -> int:
        for stream in {id(s): s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}.values():
            try:
                stream.flush()
            except Exception:  # a stream the learner's code replaced or closed
                pass
        try:
            return os.fstat(self._log_fd).st_size
        except OSError:
            return 0

    def __call__(self, step: str, blob: bytes | None = None, **fields: Any) -> None:
        if self.output_limit is not None and self._output_size() > self.output_limit:
            os._exit(STATUS_OUTPUT_LIMIT)
        if blob is not None:
            fields["size"] = len(blob)
        send_frame(self._fd, json.dumps({"step": step, **fields}).encode())
        if blob is not None:
            send_frame(self._fd, blob)


class _NoMagics:
    """Stands in for ``get_ipython()`` in graded cells: line magics and shell commands (``%timeit``,
    ``!pip install``) are skipped; the body of a cell magic (``%%time``) is run as plain Python."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self._namespace = namespace

    def run_line_magic(self, *args: Any, **kwargs: Any) -> None:
        return None

    def run_cell_magic(self, name: str, line: str, cell: str) -> None:
        if name in ("time", "timeit", "capture", "prun"):
            _run_cell(cell, self._namespace, "<cell magic>")

    def system(self, *args: Any, **kwargs: Any) -> None:
        return None

    def getoutput(self, *args: Any, **kwargs: Any) -> list[str]:
        return []

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def _run_cell(source: str, namespace: dict[str, Any], filename: str) -> None:
    """Run one cell's source like a notebook would, IPython syntax (magics, ``!cmd``) included."""
    try:
        code = compile(source, filename, "exec")
    except SyntaxError:
        transformed = to_python(source)  # one bounded pass (learner_text); the grader usually did it already
        if transformed == source:
            raise
        code = compile(transformed, filename, "exec")
    exec(code, namespace)


def _namespace() -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    namespace["get_ipython"] = lambda: _NoMagics(namespace)
    namespace["display"] = lambda *args, **kwargs: None
    return namespace


# --- confinement the worker applies to itself before any learner code ---------------------------------
def _drop_root() -> None:
    """As root in a sandbox without a user namespace: become the sandbox's own uid (RLIMIT_NPROC binds
    only for a non-root uid), with no supplementary groups. Refuses to go on as root."""
    uid = os.environ.get("ATTENTION_COURSE_SANDBOX_UID")
    if uid is None:
        return
    if os.getuid() == 0 or os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(int(uid), int(uid), int(uid))
        os.setresuid(int(uid), int(uid), int(uid))
    if os.getuid() == 0 or os.geteuid() == 0:  # pragma: no cover - setresuid cannot silently fail
        os._exit(70)


def _no_new_privs() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: no setuid binary can give privileges back
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no ptrace of this process, no core
    except Exception:  # pragma: no cover - not Linux
        pass


def _set_limit(name: str, value: int) -> None:
    import resource

    kind = getattr(resource, name, None)
    if kind is None:  # pragma: no cover
        return
    try:
        resource.setrlimit(kind, (value, value))
    except (ValueError, OSError):
        soft, hard = resource.getrlimit(kind)
        if hard == resource.RLIM_INFINITY or value <= hard:
            raise
        resource.setrlimit(kind, (hard, hard))  # already lower than asked: keep the lower one


def _address_space() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _confine(settings: dict[str, Any]) -> None:
    _drop_root()
    _no_new_privs()
    if sys.platform != "linux":  # pragma: no cover
        return
    _set_limit("RLIMIT_CORE", 0)
    _set_limit("RLIMIT_FSIZE", int(settings["file_size"]))
    _set_limit("RLIMIT_NPROC", int(settings["processes"]))
    _set_limit("RLIMIT_CPU", int(settings["cpu_seconds"]))


# --- the job ------------------------------------------------------------------------------------------
def _read_job() -> Job:
    import importlib

    data = sys.stdin.buffer.read()
    os.close(0)
    importlib.invalidate_caches()  # the grader filled this job's view of the package after the imports
    return pickle.loads(data)  # from the grader, the only writer of this pipe


def _library_names(library: tuple[tuple[str, str], ...]) -> None:
    """Put the job's allowed course-library names on the package (``ac.causal_mask``): in a sandbox, its
    ``__init__`` is a minimal one (:mod:`attention_course.grading.package_view`) that defines none."""
    import importlib

    import attention_course

    for name, module in library:
        if name not in vars(attention_course):
            found = importlib.import_module(module)
            setattr(attention_course, name, found if found.__name__ == f"attention_course.{name}" else
                    getattr(found, name))


def run_job(job: Job, say: _Channel) -> int:
    import functools
    import resource

    from attention_course.grading.exercises import get_exercise
    from attention_course.grading.import_guard import guard_library
    from attention_course.grading.wire import encode, outcome_of_call
    from attention_course.grading.wire import error as wire_error

    say.output_limit = job.output_limit
    say("start", pid=os.getpid())
    _library_names(job.library)
    exercise = get_exercise(job.exercise_id)
    parts = {name: exercise.part(name) for name, _ in job.parts}
    runs = {name: (part.run, part.function) for name, part in parts.items()}
    # The worker's own reference, taken before any learner code runs (the grader reads only this format).
    encode_outcomes = encode
    guard = None
    if job.allowed is not None:  # one allowance for every part of this job (the grader groups them)
        guard = guard_library(job.exercise_id, frozenset(job.allowed), [list(runs.values()), job.parts])
    del exercise, parts
    namespace = _namespace()

    say("preamble")
    exec(compile(job.preamble, "<preamble>", "exec"), namespace)

    for index, part_name, source in job.cells:
        say("cell", cell=index, part=part_name)
        outcome = outcome_of_call(functools.partial(_run_cell, source, namespace, f"<cell {index} {part_name}>"))
        if outcome["status"] == "error":
            say("cell_error", cell=index, part=part_name, type=outcome["type"], message=outcome["message"],
                where=outcome["where"])

    for part_name, cases in job.parts:
        say("part", part=part_name)
        run, function = runs[part_name]
        obj = namespace.get(function)
        if obj is None:
            say("missing", part=part_name)
            continue
        outcomes = [outcome_of_call(functools.partial(run, obj, case)) for case in cases]
        if guard is not None:
            if not guard.intact():
                outcomes = [wire_error("PermissionError", "your code brought back a course-library module the "
                                       "grader had removed (sys.modules)") for _ in cases]
        try:
            blob = encode_outcomes(outcomes)
        except Exception as exc:  # the learner's code broke the encoder's tools: this part's own loss
            blob = encode_outcomes([wire_error("RuntimeError", f"your results could not be sent ({exc})"[:300])
                                    for _ in cases])
        say("part_done", blob=blob, part=part_name)

    usage = resource.getrusage(resource.RUSAGE_SELF)
    say("done", cpu=float(usage.ru_utime + usage.ru_stime))  # start-up included; for benchmarks only
    return 0


#: Modules that torch imports lazily, on the first forward pass, and
#: whose import-time code looks at frames (which the guard refuses to learner code): imported up front.
_LAZY_IMPORTS = ("sympy", "torch.fx.experimental.symbolic_shapes")


def _warm_up_lazy_imports() -> None:
    import importlib

    import torch

    for name in _LAZY_IMPORTS:
        try:
            importlib.import_module(name)
        except Exception:  # not installed: nothing to import lazily either
            pass
    # torch.manual_seed imports its device modules on first use; seeding with the initial seed changes nothing.
    torch.manual_seed(torch.initial_seed())


# --- zygote mode (the notebook check): import once, fork a fresh process per job -----------------------
def _tmp_snapshot() -> set[str]:
    """Paths on the sandbox's private /tmp (its own filesystem only: binds mounted under it are skipped)."""
    try:
        device = os.stat("/tmp").st_dev
    except OSError:
        return set()
    found: set[str] = set()
    for top, folders, files in os.walk("/tmp"):
        kept = []
        for name in folders:
            path = os.path.join(top, name)
            try:
                if os.lstat(path).st_dev == device:
                    kept.append(name)
                    found.add(path)
            except OSError:
                pass
        folders[:] = kept
        found.update(os.path.join(top, name) for name in files)
    return found


def _only_process_left() -> bool:
    """Whether this is the only live process in the sandbox's PID namespace besides its init (PID 1)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in (1, os.getpid()):
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    return False
        except (OSError, IndexError):
            pass  # gone meanwhile
    return True


def _clean_up_after_job(pid: int, own_pid_namespace: bool, tmp_before: set[str]) -> bool:
    """Kill whatever the job left running and remove what it left in /tmp; whether that worked."""
    import shutil
    import signal
    import time

    if not own_pid_namespace:  # unisolated: the job's session (a process that left it is out of reach)
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        return True
    for _ in range(200):  # kill(-1): every process this uid may signal in the namespace, except PID 1 and us
        if _only_process_left():
            break
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        time.sleep(0.005)
    else:
        return False
    for path in sorted(_tmp_snapshot() - tmp_before, key=len):
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError:
            return False
    return not (_tmp_snapshot() - tmp_before)


def _serve_forks(control_fd: int, own_pid_namespace: bool) -> int:
    """Be a zygote: say ``ready`` on the control socket, then for each job the grader sends (``b"job"`` with
    three file descriptors: the job's stdin, its channel and its output log) fork a child that runs it. The
    child returns from here with its channel; the zygote waits for it, kills everything it left (the whole
    PID namespace but PID 1 and itself, as a sandbox), removes what it left in /tmp, reports
    ``exit <status>`` and waits for the next job. It never runs learner code itself, and a child cannot reach
    it: the child closes the control socket before any job code runs, and the zygote is not dumpable (no
    ptrace, no /proc/<pid>/fd). When the grader closes its end, or anything goes wrong, the zygote exits."""
    import socket

    control = socket.socket(fileno=control_fd)
    tmp_before = _tmp_snapshot() if own_pid_namespace else set()
    try:
        control.sendall(b"ready")
        while True:
            message, fds, _, _ = socket.recv_fds(control, 16, 3)
            if message != b"job" or len(fds) != 3:
                break
            job_fd, channel_fd, log_fd = fds
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the job's process: nothing of the zygote's stays open in it
                control.close()
                os.setsid()
                os.dup2(job_fd, 0)
                os.dup2(log_fd, 1)
                os.dup2(log_fd, 2)
                os.close(job_fd)
                os.close(log_fd)
                return channel_fd
            for fd in fds:
                os.close(fd)
            _, status = os.waitpid(pid, 0)
            if not _clean_up_after_job(pid, own_pid_namespace, tmp_before):
                break
            control.sendall(f"exit {os.waitstatus_to_exitcode(status)}".encode())
    except Exception:
        import traceback

        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(channel_fd: int, settings_json: str) -> None:
    """The worker's entry point (see the module docstring); never returns."""
    code = 1
    try:
        settings = json.loads(settings_json)
        _confine(settings)
        import torch

        import attention_course  # noqa: F401
        from attention_course.grading import compare, declare, import_guard, spec, wire  # noqa: F401
        from attention_course.grading.exercises import exercise_ids, get_exercise

        torch.set_num_threads(1)
        _warm_up_lazy_imports()
        for exercise_id in exercise_ids():  # in a sandbox's view, none yet: the job's comes with the job
            try:
                get_exercise(exercise_id)
            except Exception:  # a broken module fails its own jobs only
                pass
        if settings.get("memory"):
            _set_limit("RLIMIT_AS", _address_space() + int(settings["memory"]))
        if settings.get("zygote"):
            # Returns only in a forked child, which then runs one job like a worker of its own.
            channel_fd = _serve_forks(channel_fd, bool(settings.get("own_pid_namespace")))
        say = _Channel(channel_fd, os.dup(1))
        say("ready")
        job = _read_job()
        code = run_job(job, say)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        # os._exit, not sys.exit: skip interpreter shutdown, where threads or atexit hooks left by the
        # learner's code could still run (and hang) after the results are sent.
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
