"""Run a learner's graded cells in a fresh, isolated worker process, with limits, and collect outcomes.

:func:`run_parts` takes a sandbox from the warm pool (or, for the notebook check, a process forked from the
kernel's zygote) (:mod:`attention_course.grading.launcher`: bubblewrap,
no network, no view of the submissions, the solutions or the grades, its own PID namespace, rlimits it
cannot raise), sends it the job and watches it:

- every step (a cell, a part) has ``timeout`` seconds; the notebook's code as a whole has a fixed budget
  (:func:`notebook_budget`, not proportional to its cells), charged for every sandbox start after a
  group's first (at least ``RESTART_CHARGE`` seconds each), and at most parts + 2 attempts in all; a
  worker past either limit is killed;
- parts whose course-library allowances differ are judged in separate attempts (``_allowance_groups``),
  so that each worker holds one fixed allowance, and sees a view of the course package holding only the
  worker's modules, the exercise's sandbox side, what its cases need and the modules of that allowance
  (:mod:`attention_course.grading.package_view`, filled before the job is sent): a module that is not
  there cannot be imported;
- one part's results are size-checked, then read by the wire's own parser
  (:func:`attention_course.grading.wire.decode`: only the wire's types, structure limits checked before
  anything is built, linear in the bytes; no unpickler ever reads learner bytes), then checked to be plain
  data;
- the worker's channel is a pipe the grader owns: it accepts only the next expected step, once, in
  small frames (:mod:`attention_course.grading.channel`); a violation (a flood, a re-announced step, a
  deeply nested message) ends the attempt and fails the step it was in, for this learner only;
- the combined stdout and stderr go to a file in a private folder of the grader's; past ``output_limit``
  bytes the worker is killed (and the worker stops itself before announcing another step, so a fast cell
  that printed too much is blamed even between two polls);
- a worker that dies (``os._exit``, a signal, a crash) or is killed loses only the step it was in: the
  grader starts a fresh sandbox for the remaining parts, skipping a cell that hung or crashed. Outcomes
  of parts finished before are kept.

Every worker and everything it started is killed in a ``finally``, whatever happened. Cases travel to the
worker without their private data (``Case.data`` keys ``reference``, ``expected`` or starting with ``_``):
references are computed in the grader, which keeps the original cases.
"""

from __future__ import annotations

import pickle
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attention_course.grading.channel import parse_header
from attention_course.grading.isolation import Limits, SandboxUnavailable, check_sandbox, clean_text
from attention_course.grading.launcher import BLOB_LIMIT, STATUS_LOST, pool, zygote_pool
from attention_course.grading.learner_text import LearnerTextError, to_python
from attention_course.grading.package_view import fill_view, library_sources, pickle_modules, view_modules
from attention_course.grading.spec import Case
from attention_course.grading.wire import WireFormatError, decode, is_wire
from attention_course.grading.worker import STATUS_OUTPUT_LIMIT, Job

__all__ = ["BUDGET_STEPS", "DEFAULT_OUTPUT_LIMIT", "MISSING", "STARTUP_TIMEOUT", "SandboxResult", "notebook_budget",
           "results_problem",
           "prewarm", "public_case", "release", "run_parts"]

DEFAULT_OUTPUT_LIMIT = 1_000_000  # bytes of stdout + stderr per process
STARTUP_TIMEOUT = 120.0  # seconds for Python, torch and the preamble to start (a loaded machine is slow)
_POLL = 0.02
#: Failure marker of a part whose function the learner's cells did not define.
MISSING = "missing"
_PRIVATE_KEYS = frozenset({"reference", "expected", "answer", "solution"})
_MESSAGE_LIMIT = 500


#: A notebook's time budget in steps' time limits, fixed whatever the number of cells the learner brings.
BUDGET_STEPS = 12


def notebook_budget(timeout: float, cells: int = 0, parts: int = 0) -> float:
    """Seconds of learner code one notebook may run in all (every attempt): :data:`BUDGET_STEPS` times a
    step's ``timeout``. ``cells`` and ``parts`` are ignored (kept for callers of the old form): a budget
    that grew with the cells would let a notebook of many slow cells take the grader's time."""
    return timeout * BUDGET_STEPS


def _readable_cells(cells: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """The cells as they travel to the worker: a cell longer than the grader reads
    (``learner_text.CELL_LIMIT``) is replaced by one that raises, so that its
    part fails with the reason and no process spends time on it."""
    readable = []
    for index, part, source in cells:
        try:
            to_python(source)
        except LearnerTextError as exc:
            source = f"raise ValueError({str(exc)!r})\n"
        readable.append((index, part, source))
    return readable


def public_case(case: Any) -> Any:
    """``case`` as it travels to the learner's process: without the private keys of its ``data``."""
    if not isinstance(case, Case):
        return case
    data = {key: value for key, value in case.data.items()
            if key not in _PRIVATE_KEYS and not str(key).startswith("_")}
    return Case(case.name, case.args, case.kwargs, data)


@dataclass
class SandboxResult:
    """What came back from the learner's process(es).

    Attributes:
        outcomes: part -> the wire-form outcome of each case, for parts that ran to the end.
        failures: part -> why it has no outcomes: :data:`MISSING` (no such function) or a sentence
            ("while it was checked, your code did not finish within ...").
        cell_errors: part -> what went wrong running its graded cell ("raised NameError: ...", "did not
            finish within ..."); the part may still have outcomes.
        processes: how many processes (sandboxes) were started (one, plus one per crash or timeout).
        isolated: whether the learner's code ran under bubblewrap.
        worker_cpu_seconds: CPU time the workers that finished reported (start-up included; the worker's
            own word, so for benchmarks only).
        peak_memory: the most memory one attempt's sandbox used at once, all its processes and shared
            memory included (from its memory cgroup; ``None`` without one).
    """

    outcomes: dict[str, list[Any]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    cell_errors: dict[str, str] = field(default_factory=dict)
    processes: int = 0
    isolated: bool = True
    worker_cpu_seconds: float = 0.0
    peak_memory: int | None = None


def results_problem(data: bytes) -> str | None:
    """Why one part's result bytes may not be decoded, checked before anything is read: over
    ``launcher.BLOB_LIMIT``, or not the wire format's header."""
    if len(data) > BLOB_LIMIT:
        return f"its results are {len(data):,} bytes, over the limit of {BLOB_LIMIT:,}"
    if not data.startswith(b"ACW1"):
        return "its results could not be read (they are not in the grader's wire format)"
    return None


def _load_outcome_bytes(data: bytes, expected: int) -> list[Any] | str:
    """One part's outcomes, read by :func:`attention_course.grading.wire.decode` (a parser of only the wire's
    own types, with limits on the structure, linear in the bytes: no unpickler, no zip on learner bytes),
    then checked to be plain wire data of bounded size."""
    problem = results_problem(data)
    if problem:
        return problem
    try:
        outcomes = decode(data)
    except WireFormatError as exc:
        return f"its results could not be read ({clean_text(exc, 200)})"
    if not isinstance(outcomes, list) or len(outcomes) != expected:
        return "its results were incomplete"
    if not all(is_wire(outcome, -1) for outcome in outcomes):  # -1: the outcome dict around the value
        return "its results hold something that is not plain data of the allowed size"
    return outcomes


def _load_outcomes(path: Path, expected: int) -> list[Any] | str:
    """The outcomes file of one part (as :func:`_load_outcome_bytes`)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return f"its results could not be read ({type(exc).__name__})"
    return _load_outcome_bytes(data, expected)


class _Protocol:
    """The steps a job's worker must announce, in order, each once: start, preamble, each cell (with an
    optional error report), each part (then its results or "missing"), done."""

    def __init__(self, job: Job) -> None:
        self.plan: list[dict[str, Any]] = [{"step": "start"}, {"step": "preamble"}]
        self.plan += [{"step": "cell", "cell": index, "part": part} for index, part, _ in job.cells]
        self.plan += [{"step": "part", "part": part} for part, _ in job.parts]
        self.plan.append({"step": "done"})
        self.position = 0
        self.open: dict[str, Any] | None = None  # the cell that may report an error, or the part awaiting results
        self.blob_for: tuple[str, int] | None = None
        self.events: list[dict[str, Any]] = []
        self.blobs: dict[str, bytes] = {}
        self.cpu = 0.0  # CPU seconds the worker says it used (its own word: for benchmarks, never for grades)

    @property
    def max_frames(self) -> int:
        return 2 * len(self.plan) + 2

    def accept(self, frame: bytes) -> str | None:
        """Take one frame; a violation's description, or ``None``."""
        if self.blob_for is not None:
            part, size = self.blob_for
            if len(frame) != size:
                return "sent results of the wrong size"
            self.blobs[part] = frame
            self.blob_for = None
            self.events.append({"step": "part_done", "part": part})
            return None
        header = parse_header(frame)
        if header is None:
            return "sent a message that is not a small flat JSON object"
        step = header["step"]
        if self.open is not None and self.open["step"] == "part":
            part = self.open["part"]
            self.open = None
            if step == "missing" and header.get("part") == part:
                self.events.append({"step": "missing", "part": part})
                return None
            if step == "part_done" and header.get("part") == part and isinstance(header.get("size"), int) \
                    and 0 <= header["size"] <= BLOB_LIMIT:
                self.blob_for = (part, header["size"])
                return None
            return f"sent {step!r} where the results of part {part!r} were due"
        if self.open is not None and self.open["step"] == "cell":
            cell = self.open
            self.open = None
            if step == "cell_error":
                if header.get("cell") != cell["cell"] or header.get("part") != cell["part"]:
                    return "reported an error for a cell that was not running"
                self.events.append({"step": "cell_error", "cell": cell["cell"], "part": cell["part"],
                                    "type": clean_text(header.get("type", ""), 200),
                                    "message": clean_text(header.get("message", ""), _MESSAGE_LIMIT),
                                    "where": clean_text(header.get("where", ""), 200)})
                return None
        if self.position >= len(self.plan):
            return f"sent {step!r} after it was done"
        if step == "done" and isinstance(header.get("cpu"), float):
            self.cpu = max(0.0, min(header["cpu"], 1e6))
        expected = self.plan[self.position]
        if any(header.get(key) != value for key, value in expected.items()):
            return f"announced {step!r} where {expected['step']!r} was due (a step may come only once, in order)"
        self.position += 1
        self.events.append(dict(expected))
        if step in ("cell", "part"):
            self.open = expected
        return None


@dataclass
class _Attempt:
    """One worker process: how it ended and which step it was in."""

    events: list[dict[str, Any]]
    blobs: dict[str, bytes]
    reason: str | None  # None: ran to the end
    output_tail: str
    cpu: float = 0.0
    peak_memory: int | None = None


def _exit_words(code: int | None) -> str:
    if code is None or code == STATUS_LOST:
        return "ended before finishing (its exit status is unknown)"
    if code == STATUS_OUTPUT_LIMIT:
        return "stopped itself: its output passed the limit"
    if code > 128 and code - 128 in signal.Signals._value2member_map_:
        code = 128 - code  # bubblewrap reports a worker killed by signal N as 128 + N
    if code < 0 and -code in signal.Signals._value2member_map_:
        return f"was killed by signal {-code}, {signal.Signals(-code).name}"
    return f"exited with status {code}"


#: Seconds of the notebook's budget that every attempt after its first costs at least: a fresh sandbox
#: (Python, PyTorch and the exercises imported again) is work the grader's machine does for this notebook.
RESTART_CHARGE = 2.0


def _attempt(job: Job, timeout: float, output_limit: int, workers: Any, budget_left: list[float],
             first: bool = True) -> _Attempt:
    """Run one worker on ``job``. ``budget_left[0]``: seconds the notebook has left. The first attempt's
    clock runs from the worker's first cell or part (its sandbox was started ahead of need, and the trusted
    preamble is not the learner's); every later attempt, a sandbox started again because the learner's
    code ended or hung the last one, is charged its whole time from taking the sandbox, and at least
    ``RESTART_CHARGE``. What the attempt used is taken off."""
    protocol = _Protocol(job)
    taken = time.monotonic()
    for tries_left in (1, 0):  # a sandbox that did not start (no learner code has run in it) is replaced once
        try:
            sandbox = workers.take()
        except Exception as exc:
            return _Attempt([], {}, f"could not be started ({clean_text(exc, 300)})", "")
        if sandbox.wait_ready(STARTUP_TIMEOUT):
            break
        tail = clean_text(sandbox.output_tail(600), 600)
        sandbox.kill()
        if not tries_left:
            return _Attempt([], {}, "did not start" + (f" (last output: {tail})" if tail else ""), tail)
    reason: str | None = None
    learner_started: float | None = None  # when the first cell or part began
    try:
        job_bytes = pickle.dumps(job)
        view = getattr(sandbox, "view", None)
        if view is not None:  # the package as this job's worker sees it (package_view), before it reads the job
            fill_view(view, view_modules(job.exercise_id, job.allowed, pickle_modules(job_bytes)))
        sandbox.send_job(job_bytes, protocol.max_frames)
        steps = 2 + len(job.cells) + len(job.parts)
        attempt_deadline = time.monotonic() + STARTUP_TIMEOUT + timeout * steps
        seen, step_started = 1, time.monotonic()  # frame 0 was "ready"
        deadline = float("inf")
        while reason is None:
            code = sandbox.poll()
            frames = sandbox.channel.take(seen)
            for frame in frames:
                seen += 1
                violation = protocol.accept(frame)
                if violation:
                    reason = f"broke the grader's protocol: it {violation}"
                    break
                step_started = time.monotonic()
                if learner_started is None and protocol.events[-1:] and protocol.events[-1]["step"] in ("cell", "part"):
                    learner_started = step_started if first else taken
                    deadline = learner_started + budget_left[0]
            if reason:
                break
            if sandbox.channel.violation:
                reason = f"broke the grader's protocol: it {sandbox.channel.violation}"
                break
            now = time.monotonic()
            current = protocol.events[-1]["step"] if protocol.events else "start"
            limit = STARTUP_TIMEOUT if current in ("start", "preamble") else timeout
            if sandbox.output_size() > output_limit:
                reason = f"printed more than {output_limit:,} bytes of output (the limit)"
            elif now > deadline:
                reason = "used up the time this notebook may run (its time budget)"
            elif now - step_started > limit or now > attempt_deadline:
                reason = f"did not finish within the time limit of {limit:g} s (an infinite loop?)"
            elif code is not None:
                sandbox.channel.wait(seen + 1, 1.0)  # frames written just before the exit
                if sandbox.channel.take(seen):
                    continue
                break
            else:
                time.sleep(_POLL)
        tail = sandbox.output_tail()
    except Exception as exc:  # anything at all: this learner's attempt fails, the grading goes on
        reason = reason or f"could not be watched ({type(exc).__name__}: {clean_text(exc, 200)})"
        tail = ""
    finally:
        sandbox.kill()  # the worker, its PID namespace, everything it started, its private folder
        if learner_started is not None:
            budget_left[0] -= time.monotonic() - learner_started
        if not first:
            used = time.monotonic() - (taken if learner_started is None else learner_started)
            budget_left[0] -= max(0.0, RESTART_CHARGE - used) + (used if learner_started is None else 0.0)
    finished = any(event["step"] == "done" for event in protocol.events)
    if reason is None and sandbox.output_size() > output_limit:
        reason = f"printed more than {output_limit:,} bytes of output (the limit)"
    if reason is None and not finished:
        code = sandbox.poll()
        if code == STATUS_OUTPUT_LIMIT:
            reason = f"printed more than {output_limit:,} bytes of output (the limit)"
        else:
            reason = f"ended the checking process, which {_exit_words(code)} (os._exit, a signal or a crash?)"
    return _Attempt(protocol.events, protocol.blobs, reason, tail, protocol.cpu, sandbox.peak_memory)


def _isolated(isolation: str) -> bool:
    """Whether to run under bubblewrap: ``"none"`` never; ``"auto"`` where it works here; ``"required"``
    where it works, else :class:`SandboxUnavailable`."""
    if isolation == "none":
        return False
    try:
        check_sandbox()
    except SandboxUnavailable:
        if isolation == "required":
            raise
        return False
    return True


def prewarm(isolation: str = "auto", limits: Limits | None = None, output_limit: int = DEFAULT_OUTPUT_LIMIT,
            size: int = 1, reuse: bool = False) -> None:
    """Start ``size`` sandboxes now (without waiting for them), for the next :func:`run_parts` with these
    settings; each is still used once. With ``reuse`` (the notebook check): start a zygote unless one is
    idle; ``exercise(...)`` calls it, so that the first check finds its imports done."""
    isolated = _isolated(isolation)
    if reuse:
        zygote_pool(isolated, limits or Limits(), output_limit).fill()
    else:
        pool(isolated, limits or Limits(), output_limit, size).fill()


def release(isolation: str = "auto", limits: Limits | None = None,
            output_limit: int = DEFAULT_OUTPUT_LIMIT) -> None:
    """Stop the idle zygote for these settings (the notebook check, once every part passed)."""
    zygote_pool(_isolated(isolation), limits or Limits(), output_limit).close()


def run_parts(
    exercise_id: str,
    preamble: str,
    cells: list[tuple[int, str, str]],
    part_cases: list[tuple[str, list[Any]]],
    timeout: float = 30.0,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
    *,
    isolation: str = "required",
    limits: Limits | None = None,
    allowed: frozenset[str] | None = None,
    budget: float | None = None,
    warm: int = 0,
    refill: bool = True,
    reuse: bool = False,
) -> SandboxResult:
    """Run the learner's ``cells`` and then each part's cases in a fresh sandbox; see the module docstring.

    Args:
        exercise_id: the exercise whose parts' ``run`` functions call the learner's code.
        preamble: trusted source run first (the exercise's imports).
        cells: ``(cell index, part, source)`` of the learner's graded cells, in notebook order.
        part_cases: ``(part, cases)`` to run, in order (private case data is removed before they travel).
        timeout: seconds allowed for each cell and for each part's cases.
        output_limit: bytes of output allowed per process.
        isolation: ``"required"``: under bubblewrap, else raise
            :class:`~attention_course.grading.isolation.SandboxUnavailable` (the grader); ``"auto"``: under
            bubblewrap where it works, else unisolated (the notebook check; ``result.isolated`` says which);
            ``"none"``: unisolated (the grader's ``--no-sandbox``).
        limits: resource limits of each worker (default :class:`~attention_course.grading.isolation.Limits`).
        allowed: course-library names the learner's code may use (``None``: all; see
            :mod:`attention_course.grading.library_rules`). Parts whose allowances (within ``allowed``)
            differ are judged in separate attempts, each worker with one fixed allowance.
        budget: seconds the whole notebook may take, retries included (default :func:`notebook_budget`).
        warm: sandboxes to keep started ahead of need (the grader: one per notebook graded at once; the
            notebook check: one; 0: start each one when needed).
        refill: start the replacement of the sandbox taken at once (the grader). ``False``: start none; the
            caller starts one with :func:`prewarm` when it wants one (the notebook check: once the check is
            over, since on two cores a worker importing PyTorch next to the one checking slows the check, and
            only while some part has not passed).
        reuse: fork each attempt's process from a zygote kept between calls (the notebook check, one
            learner's checks in one kernel; see :class:`~attention_course.grading.launcher.Zygote`) instead
            of starting a sandbox per attempt (the grader). ``warm`` and ``refill`` do not apply.
    """
    if isolation not in ("required", "auto", "none"):
        raise ValueError(f"isolation must be 'required', 'auto' or 'none', got {isolation!r}")
    isolated = _isolated(isolation)
    limits = limits or Limits()
    workers = zygote_pool(isolated, limits, output_limit) if reuse else pool(isolated, limits, output_limit, warm)
    return _run_parts(exercise_id, preamble, cells, part_cases, timeout, output_limit, allowed, budget,
                      isolated, _Taker(workers, refill=refill))


class _Taker:
    """A pool's :meth:`~attention_course.grading.launcher.SandboxPool.take`, with or without its refill."""

    def __init__(self, workers: Any, refill: bool) -> None:
        self._workers, self._refill = workers, refill

    def take(self) -> Any:
        return self._workers.take(refill=self._refill)


_PartCases = list[tuple[str, list[Any]]]


def _allowance_groups(exercise_id: str, part_cases: _PartCases,
                      allowed: frozenset[str] | None) -> list[tuple[frozenset[str] | None, _PartCases]]:
    """The parts grouped by what they may use of the course library (``part_table`` within ``allowed``), in
    the order their first part comes: each group is judged in attempts of its own, whose worker sees exactly
    that allowance, so that no process ever holds a rule that changes from part to part (ex10: a part that may
    not call ``ac.causal_mask`` is never run where it exists). ``allowed=None`` (no rule): one group."""
    if allowed is None:
        return [(None, list(part_cases))]
    from attention_course.grading.library_rules import part_table

    table = part_table(exercise_id)
    groups: dict[frozenset[str], list[tuple[str, list[Any]]]] = {}
    for part, cases in part_cases:
        groups.setdefault(frozenset(table.get(part, frozenset()) & allowed), []).append((part, cases))
    return list(groups.items())


def _run_parts(exercise_id: str, preamble: str, cells: list[tuple[int, str, str]],
               part_cases: list[tuple[str, list[Any]]], timeout: float, output_limit: int,
               allowed: frozenset[str] | None, budget: float | None, isolated: bool, workers: Any) -> SandboxResult:
    budget = notebook_budget(timeout) if budget is None else budget
    cells = _readable_cells(cells)
    budget_left = [budget]
    result = SandboxResult(isolated=isolated)
    # A notebook gets at most parts + 2 attempts (sandbox starts) in all, however many cells it brings; each
    # retry (an attempt after the first of its group) is charged to its budget.
    attempts_left = [len(part_cases) + 2]
    for allowance, group in _allowance_groups(exercise_id, part_cases, allowed):
        _run_group(exercise_id, preamble, cells, group, timeout, output_limit, allowance, budget_left,
                   attempts_left, result, workers)
    return result


def _run_group(exercise_id: str, preamble: str, cells: list[tuple[int, str, str]],
               part_cases: list[tuple[str, list[Any]]], timeout: float, output_limit: int,
               allowed: frozenset[str] | None, budget_left: list[float], attempts_left: list[int],
               result: SandboxResult, workers: Any) -> None:
    """Judge one allowance group's parts (every cell runs, as the parts may call each other's functions;
    only the group's parts' cell errors and outcomes are kept), retrying after a crash or a hang."""
    group = {part for part, _ in part_cases}
    remaining = [(part, [public_case(case) for case in cases]) for part, cases in part_cases]
    skipped: set[int] = set()
    cell_indices = {cell[0] for cell in cells}
    number = 0
    while remaining and attempts_left[0] > 0 and (number == 0 or budget_left[0] > 0):
        attempts_left[0] -= 1
        job = Job(exercise_id, preamble, [cell for cell in cells if cell[0] not in skipped], remaining,
                  output_limit=output_limit, allowed=allowed,
                  library=library_sources(allowed) if allowed is not None else ())
        attempt = _attempt(job, timeout, output_limit, workers, budget_left, first=number == 0)
        number += 1
        result.processes += 1
        result.worker_cpu_seconds += attempt.cpu
        if attempt.peak_memory is not None:
            result.peak_memory = max(result.peak_memory or 0, attempt.peak_memory)
        finished: set[str] = set()
        for event in attempt.events:
            part = event.get("part")
            if event["step"] == "cell_error" and isinstance(part, str):
                if part in group:
                    where = f" ({event.get('where')})" if event.get("where") else ""
                    result.cell_errors[part] = f"raised {event.get('type')}: {event.get('message')}{where}"
            elif event["step"] == "missing" and isinstance(part, str):
                result.failures[part] = MISSING
                finished.add(part)
            elif event["step"] == "part_done" and isinstance(part, str):
                cases = dict(remaining).get(part)
                if cases is None or part in finished:
                    continue
                loaded = _load_outcome_bytes(attempt.blobs.get(part, b""), len(cases))
                if isinstance(loaded, str):
                    result.failures[part] = loaded
                else:
                    result.outcomes[part] = loaded
                finished.add(part)
        remaining = [(part, cases) for part, cases in remaining if part not in finished]
        if attempt.reason is None or not remaining:
            for part, _ in remaining:  # a worker that says "done" but skipped parts: never silently pass
                result.failures.setdefault(part, "no result came back")
            return
        if budget_left[0] <= 0:
            for part, _ in remaining:
                result.failures.setdefault(part, f"not checked: the notebook {attempt.reason}")
            return
        last = attempt.events[-1] if attempt.events else {"step": "start"}
        cell, part = last.get("cell"), last.get("part")
        if last["step"] in ("cell", "cell_error") and isinstance(cell, int) and cell in cell_indices - skipped:
            # The cell hung or killed the process: blame its part, rerun the others without it.
            skipped.add(cell)
            if part in group:
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
            tail = clean_text(" | ".join(attempt.output_tail.strip().splitlines()[-3:]), 600)
            for part, _ in remaining:
                result.failures[part] = (f"the grader could not start the checking process: {attempt.reason}"
                                         + (f"; last output: {tail}" if tail else ""))
            return
    for part, _ in remaining:
        result.failures.setdefault(part, "not checked: the notebook used up its attempts (one per part, plus two) "
                                         "or its time budget, ending or stalling the checking process each time")
