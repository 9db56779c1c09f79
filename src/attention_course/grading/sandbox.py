"""Run a learner's graded cells in a separate process, with time and output limits, and collect outcomes.

:func:`run_parts` starts :mod:`attention_course.grading.worker` in a fresh process (forked from a
launcher that has torch imported, see :mod:`attention_course.grading.launcher`; in its own session, so
that the learner's child processes die with it), feeds it a job file, and watches it:

- every step (a cell, a part) has ``timeout`` seconds; a step that runs longer is killed;
- the process's combined stdout and stderr go to a file; a process that prints more than
  ``output_limit`` bytes is killed (and the worker, which knows the limit too, stops itself before
  announcing another step, so a fast cell that printed too much is blamed even between two polls);
- a process that dies (``os._exit``, a signal, a crash) or is killed loses only the step it was in: the
  grader starts a fresh process for the remaining parts, skipping a cell that hung or crashed. Outcomes
  of parts finished before the crash are kept.

What this is and is not: process isolation with timeouts, enough for honest mistakes and for the usual
tricks (``sys.exit``, infinite loops, monkeypatching the checker inside the kernel). It is not a security
boundary: code running as the same user can read and write the same files.
"""

from __future__ import annotations

import json
import pickle
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attention_course.grading.launcher import OUTPUT_LOG, STATUS_LOST, start_worker
from attention_course.grading.worker import Job

__all__ = ["SandboxResult", "run_parts", "DEFAULT_OUTPUT_LIMIT", "MISSING", "STARTUP_TIMEOUT"]

DEFAULT_OUTPUT_LIMIT = 1_000_000  # bytes of stdout + stderr per process
STARTUP_TIMEOUT = 120.0  # seconds for Python, torch and the preamble to start (a loaded machine is slow)
_POLL = 0.02
_RESULT_ALLOWANCE = 64_000_000  # bytes a worker may write to files beyond its output (results)
#: Failure marker of a part whose function the learner's cells did not define.
MISSING = "missing"


@dataclass
class SandboxResult:
    """What came back from the learner's process(es).

    Attributes:
        outcomes: part -> the wire-form outcome of each case, for parts that ran to the end.
        failures: part -> why it has no outcomes: :data:`MISSING` (no such function) or a sentence
            ("while it was checked, your code did not finish within ...").
        cell_errors: part -> what went wrong running its graded cell ("raised NameError: ...", "did not
            finish within ..."); the part may still have outcomes.
        processes: how many processes were started (one, plus one per crash or timeout).
    """

    outcomes: dict[str, list[Any]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    cell_errors: dict[str, str] = field(default_factory=dict)
    processes: int = 0


def _read_events(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    events = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and isinstance(event.get("step"), str):
            events.append(event)
    return events


def _load_outcomes(path: Path, expected: int) -> list[Any] | str:
    """The outcomes file of one part, read with the weights-only unpickler (no code can run)."""
    try:
        outcomes = torch.load(path, weights_only=True)
    except Exception as exc:
        return f"its results could not be read ({type(exc).__name__})"
    if not isinstance(outcomes, list) or len(outcomes) != expected:
        return "its results were incomplete"
    return outcomes


@dataclass
class _Attempt:
    """One worker process: how it ended and which step it was in."""

    events: list[dict[str, Any]]
    reason: str | None  # None: ran to the end
    output_tail: str


def _output_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as log:
            log.seek(max(0, _output_size(path) - 2000))
            return log.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _attempt(job: Job, timeout: float, output_limit: int, job_dir: Path) -> _Attempt:
    (job_dir / "job.pkl").write_bytes(pickle.dumps(job))
    events_path, log_path = job_dir / "events.jsonl", job_dir / OUTPUT_LOG
    try:
        worker = start_worker(job_dir, STARTUP_TIMEOUT)
    except OSError as exc:
        return _Attempt([], f"could not be started ({exc})", "")
    # A step may not be announced twice, so the total time is bounded even if the learner's code writes
    # fake events.
    steps = 2 + len(job.cells) + len(job.parts)
    deadline_total = time.monotonic() + STARTUP_TIMEOUT + timeout * steps
    seen, step_started, reason = 0, time.monotonic(), None
    current = "start"
    while (code := worker.poll()) is None:
        time.sleep(_POLL)
        events = _read_events(events_path)
        if len(events) > seen:
            seen, step_started = len(events), time.monotonic()
            current = events[-1]["step"]
        limit = STARTUP_TIMEOUT if current in ("start", "preamble") else timeout
        now = time.monotonic()
        if _output_size(log_path) > output_limit:
            reason = f"printed more than {output_limit:,} bytes of output (the limit)"
        elif now - step_started > limit or now > deadline_total:
            reason = f"did not finish within the time limit of {limit:g} s (an infinite loop?)"
        if reason:
            break
    worker.kill()  # the worker if it still runs, and any process the learner's code left behind
    events = _read_events(events_path)
    if reason is None and _output_size(log_path) > output_limit:
        reason = f"printed more than {output_limit:,} bytes of output (the limit)"
    if reason is None and not any(event["step"] == "done" for event in events):
        if code == STATUS_LOST:
            how = "ended before finishing (its exit status is unknown)"
        elif code is not None and code < 0 and -code in signal.Signals._value2member_map_:
            how = f"was killed by signal {-code}, {signal.Signals(-code).name}"
        else:
            how = f"exited with status {code}"
        reason = f"ended the checking process, which {how} (os._exit, a signal or a crash?)"
    return _Attempt(events, reason, _tail(log_path))


def run_parts(
    exercise_id: str,
    preamble: str,
    cells: list[tuple[int, str, str]],
    part_cases: list[tuple[str, list[Any]]],
    timeout: float = 30.0,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
) -> SandboxResult:
    """Run the learner's ``cells`` and then each part's cases in a fresh process; see the module docstring.

    Args:
        exercise_id: the exercise whose parts' ``run`` functions call the learner's code.
        preamble: trusted source run first (the exercise's imports).
        cells: ``(cell index, part, source)`` of the learner's graded cells, in notebook order.
        part_cases: ``(part, cases)`` to run, in order.
        timeout: seconds allowed for each cell and for each part's cases.
        output_limit: bytes of output allowed per process.
    """
    result = SandboxResult()
    remaining = list(part_cases)
    skipped: set[int] = set()
    cell_indices = {cell[0] for cell in cells}
    # Every retry skips a cell or drops a part, so this many attempts always suffice (a backstop against
    # events faked by the learner's code).
    for _ in range(len(cells) + len(part_cases) + 1):
        if not remaining:
            break
        job = Job(exercise_id, preamble, [cell for cell in cells if cell[0] not in skipped], remaining,
                  file_size_limit=output_limit + _RESULT_ALLOWANCE, output_limit=output_limit)
        with tempfile.TemporaryDirectory(prefix="attention-course-grading-", ignore_cleanup_errors=True) as tmp:
            job_dir = Path(tmp)
            attempt = _attempt(job, timeout, output_limit, job_dir)
            result.processes += 1
            finished: set[str] = set()
            for event in attempt.events:
                part = event.get("part")
                if event["step"] == "cell_error" and isinstance(part, str):
                    where = f" ({event.get('where')})" if event.get("where") else ""
                    result.cell_errors[part] = f"raised {event.get('type')}: {event.get('message')}{where}"
                elif event["step"] == "missing" and isinstance(part, str):
                    result.failures[part] = MISSING
                    finished.add(part)
                elif event["step"] == "part_done" and isinstance(part, str):
                    cases = dict(remaining).get(part)
                    if cases is None or part in finished:
                        continue
                    loaded = _load_outcomes(job_dir / f"{part}.pt", len(cases))
                    if isinstance(loaded, str):
                        result.failures[part] = loaded
                    else:
                        result.outcomes[part] = loaded
                    finished.add(part)
        remaining = [(part, cases) for part, cases in remaining if part not in finished]
        if attempt.reason is None or not remaining:
            for part, _ in remaining:  # a worker that says "done" but skipped parts: never silently pass
                result.failures.setdefault(part, "no result came back")
            break
        last = attempt.events[-1] if attempt.events else {"step": "start"}
        cell, part = last.get("cell"), last.get("part")
        if last["step"] in ("cell", "cell_error") and isinstance(cell, int) and cell in cell_indices - skipped:
            # The cell hung or killed the process: blame its part, rerun the others without it.
            skipped.add(cell)
            result.cell_errors[str(part)] = attempt.reason
        elif last["step"] in ("part", "missing") and isinstance(part, str) and part in dict(remaining):
            result.failures[part] = f"while it was checked, your code {attempt.reason}"
            remaining = [(p, c) for p, c in remaining if p != part]
        elif any(event["step"] in ("cell", "part") for event in attempt.events):
            # Died between steps (a thread left by the learner's code?): blame the next part, go on.
            part = remaining[0][0]
            result.failures[part] = f"while it was checked, your code {attempt.reason}"
            remaining = remaining[1:]
        else:
            # Python, torch or the preamble did not start: no learner code has run yet. Nothing to retry.
            tail = attempt.output_tail.strip().splitlines()[-3:]
            for part, _ in remaining:
                result.failures[part] = (f"the grader could not start the checking process: {attempt.reason}"
                                         + (f"; last output: {' | '.join(tail)}" if tail else ""))
            break
    for part, _ in remaining:
        result.failures.setdefault(part, "no result came back")
    return result
