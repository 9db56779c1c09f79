"""Start notebook kernels by forking one process that has already imported PyTorch.

    python _ext/kernel_zygote.py REQUESTS_FD REPLIES_FD     # started by course_execution.py's workers

Every lesson's kernel imports PyTorch first (2.5-3 s of CPU on a two-core build machine), and a fresh
kernel pays it again for each of the book's notebooks. This process (the "zygote") pays it once: it imports
PyTorch, NumPy and the kernel machinery, then forks a kernel for each notebook it is asked to run. A forked
kernel starts as a fresh ``python -m ipykernel_launcher`` would (same interpreter, environment, ``sys.path``
and arguments), except that those modules are already in ``sys.modules``. Nothing runs in the zygote before
the fork but imports: no threads, no event loop, no ZeroMQ context, no course code, no matplotlib (whose
backend a kernel chooses).

The protocol is one JSON object per line. The zygote first replies
``{"preload_cpu_s": CPU seconds of its start-up and imports}``. Then, for each request
``{"connection_file", "cwd"}``, it replies ``{"pid"}`` once the kernel is forked, and
``{"pid", "status", "cpu_s"}`` once the kernel has exited: ``cpu_s`` is the user and system time that
``wait4`` reports for the kernel and every process it waited for, the measure ``RUSAGE_CHILDREN`` gives for a
kernel started with ``subprocess``. A request ``{"calibrate": true}`` is answered ``{"calibration_cpu_s"}``:
the machine's speed now (``_ext/cpu_calibration.py``), measured in a forked child. It exits when its requests
pipe closes; if that happens while a kernel runs (the worker was stopped), it kills the kernel first. A kernel
exits when the zygote does, as a kernel started by jupyter_client exits when its parent does.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import sys

PRELOADED = ("torch", "numpy", "ipykernel.kernelapp")


def reply(stream, message: dict) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def run_kernel(connection_file: str, cwd: str, protocol_fds: tuple[int, int]) -> None:
    """In the forked child: become the kernel a fresh ``python -m ipykernel_launcher`` would be."""
    for fd in protocol_fds:
        os.close(fd)
    os.chdir(cwd)
    parent = str(os.getppid())
    os.environ["JPY_PARENT_PID"] = parent  # as jupyter_client sets it for the kernels it starts
    # ipykernel_launcher starts without the script's folder on sys.path (IPython adds '' back itself); here the
    # script is this file, whose folder (_ext) a kernel must not see.
    del sys.path[0]
    sys.argv = [
        "ipykernel_launcher",
        "-f",
        connection_file,
        "--HistoryManager.hist_file=:memory:",  # as nbclient starts kernels
        f"--IPKernelApp.parent_handle={parent}",  # the kernel exits if the zygote goes away
    ]
    from ipykernel import kernelapp

    kernelapp.launch_new_instance(argv=sys.argv[1:])


def wait_for_kernel(pid: int, requests_fd: int):
    """``wait4`` for the kernel; if the worker goes away meanwhile (its end of the pipe closes), kill it first."""
    try:
        watch = os.pidfd_open(pid)  # readable once the kernel has exited
        timeout = None
    except (AttributeError, OSError):  # no pidfd (old kernel or Python): look every 0.2 s
        watch, timeout = None, 0.2
    try:
        while True:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                return status, usage
            ready, _, _ = select.select([requests_fd] + ([watch] if watch is not None else []), [], [], timeout)
            if requests_fd in ready and not os.read(requests_fd, 1):  # no request comes while a kernel runs
                os.kill(pid, signal.SIGKILL)
                os.wait4(pid, 0)
                sys.exit(0)
    finally:
        if watch is not None:
            os.close(watch)


def calibrate(replies) -> None:
    """Reply ``{"calibration_cpu_s"}``: cpu_calibration.py's workload timed in a forked child, which has
    PyTorch imported as a kernel has (the zygote itself runs nothing but imports)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        status = 1
        try:
            import cpu_calibration  # beside this file: the script's folder is sys.path[0] here

            os.write(write_fd, json.dumps({"calibration_cpu_s": cpu_calibration.measure()}).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as result:
        answer = result.read()
    _, status = os.waitpid(pid, 0)
    reply(replies, json.loads(answer) if status == 0 and answer else {"calibration_error": f"status {status}"})


def main(requests_fd: int, replies_fd: int) -> None:
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)
    requests, replies = os.fdopen(requests_fd, "rb", buffering=0), os.fdopen(replies_fd, "w")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    reply(replies, {"preload_cpu_s": round(usage.ru_utime + usage.ru_stime, 3)})
    for line in requests:  # unbuffered: nothing is read ahead of the line
        request = json.loads(line)
        if request.get("calibrate"):
            calibrate(replies)
            continue
        pid = os.fork()
        if pid == 0:
            status = 0
            try:
                run_kernel(request["connection_file"], request["cwd"], (requests_fd, replies_fd))
            except SystemExit as stop:  # the kernel's own exit, after a shutdown request
                status = stop.code if isinstance(stop.code, int) else 0
            except BaseException:
                import traceback

                traceback.print_exc()
                status = 1
            # Exit as a kernel process exits, but never return into this loop: first wait for the threads that
            # are not daemons, as the interpreter's exit does (the kernel's control thread may still be
            # flushing its output through the IOPub thread, which the kernel's atexit handler stops: without
            # this wait each flush timed out after 10 s, seen as 10-30 s stalls at a kernel's exit); then the
            # atexit handlers (the grader's sandboxes are cleaned up there).
            try:
                sys.stdout.flush()
                sys.stderr.flush()
                import atexit
                import threading

                for thread in threading.enumerate():
                    if thread is not threading.current_thread() and not thread.daemon:
                        thread.join()
                atexit._run_exitfuncs()
            finally:
                os._exit(status)
        reply(replies, {"pid": pid})
        status, usage = wait_for_kernel(pid, requests_fd)
        reply(replies, {"pid": pid, "status": status, "cpu_s": round(usage.ru_utime + usage.ru_stime, 3)})


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
