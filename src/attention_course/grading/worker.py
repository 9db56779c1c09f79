"""The learner's side of grading: runs in its own process, started by :mod:`attention_course.grading.sandbox`.

``python -m attention_course.grading.worker JOB_DIR`` reads ``JOB_DIR/job.pkl`` (written by the grader),
then:

1. runs the exercise's trusted preamble (imports);
2. runs the learner's graded cells, in notebook order, in one namespace (errors are recorded, not fatal);
3. for each part, calls the part's ``run`` on every case the grader sent, and writes the wire-form
   outcomes to ``JOB_DIR/<part>.pt`` as soon as the part is done, so that results survive a later crash.

Every step is announced in ``JOB_DIR/events.jsonl`` before it starts, so that the grader knows which
cell or part to blame when the process hangs or dies. The worker judges nothing: verdicts are computed
in the grader's process from its own copy of the inputs.
"""

from __future__ import annotations

import builtins
import json
import os
import pickle
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attention_course.grading.launcher import OUTPUT_LOG

__all__ = ["Job", "STATUS_OUTPUT_LIMIT", "main"]


@dataclass
class Job:
    """What the grader sends: the exercise, the learner's graded cells, and the cases to run.

    Attributes:
        exercise_id: which checks module's parts to use (for their ``run`` functions).
        preamble: trusted source run before the cells.
        cells: ``(cell index in the notebook, part name, source)`` in notebook order.
        parts: ``(part name, cases)`` in the order to run them.
        file_size_limit: the largest file (output log included) the worker may write, in bytes.
        output_limit: bytes of output allowed; past it the worker stops before its next step (None: no
            limit of its own, the grader's watch only).
    """

    exercise_id: str
    preamble: str
    cells: list[tuple[int, str, str]]
    parts: list[tuple[str, list[Any]]]
    file_size_limit: int = 100_000_000
    output_limit: int | None = None


#: Exit status of a worker that stopped itself because its output passed the job's ``output_limit``.
STATUS_OUTPUT_LIMIT = 3


class _Events:
    """Appends one JSON object per line to ``events.jsonl`` and flushes it at once.

    With an ``output_limit`` set, a step is announced only while the output log is within it. The grader
    polls the log only every few milliseconds, and a fast cell can print megabytes and finish in less;
    stopping here keeps the blame on the step that printed, not on whichever step the grader saw next.
    """

    def __init__(self, path: Path, output_log: Path) -> None:
        self._file = open(path, "a", encoding="utf-8")  # stays open for the worker's lifetime
        self._output_log = output_log
        self.output_limit: int | None = None

    def _output_size(self) -> int:
        for stream in {id(s): s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}.values():
            try:
                stream.flush()
            except Exception:  # a stream the learner's code replaced or closed
                pass
        try:
            return self._output_log.stat().st_size
        except OSError:
            return 0

    def __call__(self, step: str, **fields: Any) -> None:
        if self.output_limit is not None and self._output_size() > self.output_limit:
            os._exit(STATUS_OUTPUT_LIMIT)
        self._file.write(json.dumps({"step": step, **fields}) + "\n")
        self._file.flush()


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
        try:
            from IPython.core.inputtransformer2 import TransformerManager
        except ImportError:
            raise
        transformed = TransformerManager().transform_cell(source)
        if transformed == source:
            raise
        code = compile(transformed, filename, "exec")
    exec(code, namespace)


def _namespace() -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    namespace["get_ipython"] = lambda: _NoMagics(namespace)
    namespace["display"] = lambda *args, **kwargs: None
    return namespace


def _limit_file_size(limit: int) -> None:
    """A hard cap on what the process may write to any file (a backstop for the grader's output limit)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    except (ValueError, OSError):
        pass


def _save(path: Path, outcomes: list[dict[str, Any]]) -> None:
    import torch

    partial = path.with_suffix(".partial")
    torch.save(outcomes, partial)
    os.replace(partial, path)  # the grader never sees a half-written file


def run(job_dir: Path) -> int:
    events = _Events(job_dir / "events.jsonl", job_dir / OUTPUT_LOG)
    events("start", pid=os.getpid())
    job: Job = pickle.loads((job_dir / "job.pkl").read_bytes())
    events.output_limit = job.output_limit

    import functools

    import torch

    from attention_course.grading.exercises import get_exercise
    from attention_course.grading.wire import outcome_of_call

    torch.set_num_threads(1)
    _limit_file_size(job.file_size_limit)
    exercise = get_exercise(job.exercise_id)
    namespace = _namespace()

    events("preamble")
    exec(compile(job.preamble, "<preamble>", "exec"), namespace)

    for index, part_name, source in job.cells:
        events("cell", cell=index, part=part_name)
        outcome = outcome_of_call(functools.partial(_run_cell, source, namespace, f"<cell {index}>"))
        if outcome["status"] == "error":
            events("cell_error", cell=index, part=part_name, type=outcome["type"], message=outcome["message"],
                   where=outcome["where"])

    for part_name, cases in job.parts:
        events("part", part=part_name)
        part = exercise.part(part_name)
        obj = namespace.get(part.function)
        if obj is None:
            events("missing", part=part_name)
            continue
        outcomes = [outcome_of_call(functools.partial(part.run, obj, case)) for case in cases]
        _save(job_dir / f"{part_name}.pt", outcomes)
        events("part_done", part=part_name)

    events("done")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m attention_course.grading.worker JOB_DIR", file=sys.stderr)
        return 2
    return run(Path(args[0]))


if __name__ == "__main__":
    # os._exit, not sys.exit: skip interpreter shutdown, where threads or atexit hooks left by the learner's
    # code could still run (and hang) after the results are written.
    sys.stdout.flush()
    os._exit(main())
