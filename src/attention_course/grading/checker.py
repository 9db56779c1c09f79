"""The check object a notebook uses: ``check = exercise("ex02")``, then ``check.<part>(my_function)``.

One verdict: a check evaluates exactly what the instructor's grader will. It takes the graded cells as the
learner last ran them (the source of the cell that defined each part's function, which the kernel keeps),
runs them after the exercise's trusted preamble in a fresh process, through the very code the grader uses
(:func:`attention_course.grading.sandbox.run_parts` and :func:`attention_course.grading.evaluate.assemble`),
and prints one line per case, a result line and a progress line. That process has a time limit per part,
so an infinite loop is stopped and named; where the operating system's sandbox is not available (Colab,
macOS) it runs unisolated, and the check says so once. A check does not wait for Python and PyTorch to
start: ``exercise(...)`` starts a zygote for the kernel (:class:`~attention_course.grading.launcher.Zygote`,
in a sandbox of its own), which imports them once and forks a fresh process for each check; between two
checks it kills whatever the last one left running and removes what it left in ``/tmp``, and a check that
ends badly takes the zygote with it. Once every part passes the zygote stops.

Which cell is graded: the grader reads, for each part, the saved notebook's graded cell (tag ``graded``) and
carries plain functions and imports from the code cells still in the notebook. The check applies the same
rule to what the kernel ran, cell by cell: front ends that send a cell id with each execution (JupyterLab,
Notebook 7; IPython passes it to the ``pre_run_cell`` event as ``ExecutionInfo.cell_id``) let it take each
part's code from the latest run of the cell with the handed-out id ``graded-<part>`` (or, where the front end
sends the cell's metadata, as JupyterLab does, a cell tagged ``graded`` for the part), whatever cell defined
the function passed to it, and carry helpers only from cells not deleted since (JupyterLab reports deleted
cells with the next execution). Where the kernel cannot tell cells apart (no cell ids: plain IPython, older
front ends, or a notebook without the handed-out ids) it judges the cell that defined the function, as it
ran, and says once exactly what the grader will read instead (:data:`NO_CELL_IDS`).

Where the learner's code depends on something the grader will not see (a helper or an import in another
cell, an edited check cell), the check says so in words. Outside a notebook kernel (a function whose cell
source is unknown, e.g. built with ``exec``) the check runs the function in this process instead, with the
same verdicts but no time limit, and says so.

A check never raises because of the learner's code (a ``NotImplementedError`` reads "not attempted yet").
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import linecache
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

from attention_course.grading.evaluate import (
    assemble,
    bound_names,
    carried_definitions,
    check_cell_ok,
    dependencies,
    outside_names,
    with_carried,
)
from attention_course.grading.exercises import get_exercise
from attention_course.grading.feedback import format_hint, format_overview, format_part, format_progress
from attention_course.grading.findings import FailureKind
from attention_course.grading.judge import PartVerdict, failed_part, judge_part
from attention_course.grading.library_rules import exercise_allowed, library_aliases, library_problem
from attention_course.grading.notebook_format import (
    METADATA_KEY,
    TAG_GRADED,
    defined_names,
    handout_cell_part,
)
from attention_course.grading.spec import Exercise, Part
from attention_course.grading.wire import describe, outcome_of_call

__all__ = ["CellLog", "Checker", "exercise", "NOTEBOOK_TIME_LIMIT", "NO_CELL_IDS"]

#: Seconds a part's cases may take in the notebook check, unless the part sets its own ``time_limit``.
NOTEBOOK_TIME_LIMIT = 20.0


def _fresh_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") & (2**63 - 1)


def _is_cell_file(filename: str) -> bool:
    """Whether ``filename`` is a notebook cell's (ipykernel: /tmp/ipykernel_<pid>/<hash>.py; older IPython:
    <ipython-input-N-...>), whose whole source the kernel keeps in ``linecache``."""
    return "ipykernel_" in filename or filename.startswith("<ipython-input") or filename.startswith("<graded-cell")


def _code_of(obj: Any) -> Any:
    """A code object defined by ``obj``'s cell: the function's own, or a method's for a class."""
    obj = inspect.unwrap(obj) if callable(obj) else obj
    if inspect.isclass(obj):
        for value in vars(obj).values():
            value = getattr(value, "__func__", value)
            if inspect.isfunction(value) and _is_cell_file(value.__code__.co_filename):
                return value.__code__
        return None
    return getattr(obj, "__code__", None)


def cell_source(obj: Any) -> tuple[str, str] | None:
    """``(cell file name, whole cell source)`` of the notebook cell that defined ``obj``, if the kernel knows it."""
    code = _code_of(obj)
    if code is None or not _is_cell_file(code.co_filename):
        return None
    lines = linecache.getlines(code.co_filename)
    return (code.co_filename, "".join(lines)) if lines else None


def _kernel() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _history(shell: Any) -> list[str]:
    """Every input the kernel ran, oldest first (where the learner's helpers and imports were written)."""
    try:
        return [text for text in shell.history_manager.input_hist_raw if isinstance(text, str)]
    except Exception:
        return []


def _current_cell(shell: Any) -> str | None:
    """The source of the cell being run (the check cell), from IPython's input history."""
    try:
        history = shell.history_manager.input_hist_raw
        return history[-1] if history else None
    except Exception:
        return None


# --- which cell is which: the cell ids front ends send with each execution ------------------------------
#: What the check says, once, where the kernel cannot tell the notebook's cells apart.
NO_CELL_IDS = ("(This check cannot tell which notebook cell is which: {why}. So it judges the cell where "
               "you last defined your function, as you ran it, with helpers from any cell you ran. The grader "
               "reads the saved notebook instead: for each part only its graded cell (the one under the "
               "part's heading, where you were asked to write the function), and plain functions and imports "
               "from the code cells still in the notebook. An answer written in another cell, or a helper in "
               "a cell you deleted, earns nothing there: keep each answer in its graded cell.)")


@dataclasses.dataclass
class _Run:
    """The latest run of one cell: its source, and the part it is the graded cell of (``None``: none)."""

    source: str
    part: str | None


class CellLog:
    """The cells this kernel ran, by the id the front end sent with each execution (latest run of each).

    Filled by IPython's ``pre_run_cell`` event (:meth:`install`). ``deleted`` holds the ids of cells the
    front end reported deleted (JupyterLab sends ``deletedCells`` in each execute request's metadata: the
    cells deleted since the previous execution); ``tracks_deletions`` says whether it ever did. ``start``
    is the number of inputs the kernel had run before the log started (their cell ids are not known).
    """

    def __init__(self, start: int = 0) -> None:
        self.runs: dict[str, _Run] = {}
        self.deleted: set[str] = set()
        self.tracks_deletions = False
        self.current: str | None = None
        self.start = start

    def record(self, cell_id: Any, source: Any, metadata: Any) -> None:
        """One execution: ``cell_id`` (``None`` when the front end sent none), its source, and the execute
        request's metadata (JupyterLab: ``cellId``, ``deletedCells`` and the cell's own metadata)."""
        metadata = metadata if isinstance(metadata, dict) else {}
        deleted = metadata.get("deletedCells")
        if isinstance(deleted, list):
            self.tracks_deletions = True
            self.deleted.update(item for item in deleted if isinstance(item, str))
        self.current = cell_id if isinstance(cell_id, str) and cell_id else None
        if self.current is None or not isinstance(source, str):
            return
        self.deleted.discard(self.current)  # run again: it is there (an undone deletion keeps its id)
        self.runs.pop(self.current, None)
        self.runs[self.current] = _Run(source, _graded_part(self.current, metadata))  # dict order: latest last

    def present(self) -> list[tuple[str, _Run]]:
        """``(cell id, latest run)`` of every cell not reported deleted, the latest run last."""
        return [(cell_id, run) for cell_id, run in self.runs.items() if cell_id not in self.deleted]

    def knows(self, exercise: Exercise) -> bool:
        """Whether the cells the kernel ran name this exercise's graded or check cells (handed-out ids, or the
        metadata JupyterLab sends): only then can the check find the cells the grader reads."""
        names = {part.name for part in exercise.parts}
        for cell_id, run in self.runs.items():
            known = handout_cell_part(cell_id)
            if run.part in names or (known is not None and known[1] in names):
                return True
        return False

    @classmethod
    def install(cls, shell: Any) -> CellLog | None:
        """The log of ``shell`` (an IPython shell), started on the first call; ``None`` outside IPython."""
        if shell is None or getattr(shell, "events", None) is None:
            return None
        log = _LOGS.get(id(shell))
        if log is not None and log[0] is shell:
            return log[1]
        new = cls(start=max(0, len(_history(shell)) - 1))

        def pre_run_cell(info: Any) -> None:
            try:
                metadata = _request_metadata(shell)
                new.record(getattr(info, "cell_id", None) or metadata.get("cellId"),
                           getattr(info, "raw_cell", None), metadata)
            except Exception:  # never in the way of the learner's cell
                new.current = None

        try:
            shell.events.register("pre_run_cell", pre_run_cell)
        except Exception:
            return None
        # The cell running now (that called exercise(...)) ran before the log started: record it from the request.
        metadata = _request_metadata(shell)
        current = _current_cell(shell)
        new.record(metadata.get("cellId"), current, metadata)
        _LOGS[id(shell)] = (shell, new)
        return new


_LOGS: dict[int, tuple[Any, CellLog]] = {}


def _graded_part(cell_id: str, metadata: dict) -> str | None:
    """The part whose graded cell this is: by its handed-out id, else by the cell metadata the front end sent."""
    known = handout_cell_part(cell_id)
    if known is not None:
        return known[1] if known[0] == "graded" else None
    tags = metadata.get("tags")
    grading = metadata.get(METADATA_KEY)
    part = grading.get("part") if isinstance(grading, dict) else None
    if isinstance(tags, list) and TAG_GRADED in tags and isinstance(part, str):
        return part
    return None


def _request_metadata(shell: Any) -> dict:
    """The metadata of the execute request being run (ipykernel), or ``{}``."""
    get_parent = getattr(getattr(shell, "kernel", None), "get_parent", None)
    if get_parent is None:  # plain IPython: no kernel, no request
        return {}
    try:
        try:
            parent = get_parent("shell")
        except TypeError:  # ipykernel before 6
            parent = get_parent()
    except Exception:
        return {}
    metadata = parent.get("metadata") if isinstance(parent, dict) else None
    return metadata if isinstance(metadata, dict) else {}


@dataclasses.dataclass
class _ByCell:
    """The graded cells as the grader will choose them, found by cell id in the kernel's runs."""

    sources: dict[str, str]  # part -> source of the latest run of its graded cell
    others: list[str]  # sources of the other cells still present (carry helpers from these)
    deleted: set[str]  # parts whose graded cell was deleted
    doubled: list[str]  # parts with more than one graded cell
    tracks_deletions: bool
    gone: list[str] = dataclasses.field(default_factory=list)  # sources of the cells reported deleted


def _defined_only_in(name: str, by_cell: _ByCell) -> bool:
    """Whether ``name`` is bound by a deleted cell and by no cell still present."""
    return (any(name in bound_names(source) for source in by_cell.gone)
            and not any(name in bound_names(source) for source in [*by_cell.others, *by_cell.sources.values()]))


def _by_cell(log: CellLog, exercise: Exercise, shell: Any) -> _ByCell:
    present = log.present()
    sources: dict[str, str] = {}
    chosen: set[str] = set()
    doubled: list[str] = []
    for part in exercise.parts:
        found = [(cell_id, run) for cell_id, run in present if run.part == part.name]
        if len(found) > 1:
            doubled.append(part.name)
            found = [cell for cell in found if part.function in defined_names(cell[1].source)] or found
        if found:
            chosen.add(found[-1][0])
            sources[part.name] = found[-1][1].source
    deleted = {part.name for part in exercise.parts if part.name not in sources and any(
        run.part == part.name for cell_id, run in log.runs.items() if cell_id in log.deleted)}
    before = _history(shell)[1:log.start] if shell is not None else []  # run before the log started
    others = [*before, *(run.source for cell_id, run in present if cell_id not in chosen)]
    gone = [run.source for cell_id, run in log.runs.items() if cell_id in log.deleted]
    return _ByCell(sources, others, deleted, doubled, log.tracks_deletions, gone)


def _same_code(shell: Any, defined_in: str, graded: str) -> bool:
    """Whether a function's cell (as compiled: transformed) is the graded cell (as typed)."""
    try:
        graded = shell.transform_cell(graded)
    except Exception:
        pass
    return defined_in.strip() == graded.strip()


class Checker:
    """Checks for one exercise; each part is a method: ``check.soft_attention_weights(fn, hint=False)``.

    Args:
        exercise: the exercise whose parts to check.
        seed: seed for the random cases; by default a fresh one on every call, so that an answer written
            to fit one set of inputs cannot pass.
        time_limit: seconds a part's cases may take (default: the part's ``time_limit``, else
            :data:`NOTEBOOK_TIME_LIMIT`).
        isolated: run the graded cells in a fresh process like the grader (default: whenever the cells'
            sources are known, i.e. in a notebook kernel); ``False`` runs the function in this process.
        namespace: where the learner's functions live (default: the kernel's, else the caller's globals).
    """

    def __init__(self, exercise: Exercise, seed: int | None = None, time_limit: float | None = None,
                 isolated: bool | None = None, namespace: Mapping[str, Any] | None = None) -> None:
        self._exercise = exercise
        self._seed = seed
        self._time_limit = time_limit
        self._isolated = isolated
        self._namespace = namespace
        self._verdicts: dict[str, PartVerdict] = {}
        self._said: set[str] = set()

    # --- one method per part ------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._part_names():
            return functools.partial(self._unknown, name)
        return functools.partial(self.check, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._part_names()))

    def _part_names(self) -> list[str]:
        return [part.name for part in self._exercise.parts]

    def _unknown(self, name: str, *args: Any, **kwargs: Any) -> None:
        print(f"{self._exercise.id} has no part {name!r}; its parts are: {', '.join(self._part_names())}.")

    def _part(self, name: Any) -> Part | None:
        if isinstance(name, str) and name in self._part_names():
            return self._exercise.part(name)
        if isinstance(name, int) and 1 <= name <= len(self._exercise.parts):
            return self._exercise.parts[name - 1]
        self._unknown(str(name))
        return None

    def check(self, part_name: str, obj: Any, hint: bool = False) -> None:
        """Run part ``part_name``'s cases on ``obj`` (the learner's function or class) and print the report."""
        part = self._part(part_name)
        if part is None:
            return
        notes: list[str] = []
        verdict = self._judge(part, obj, notes)
        self._verdicts[part.name] = verdict
        for note in notes:
            print(note)
        print(format_part(self._exercise, part, verdict, hint=hint))
        print(format_progress(self._exercise, self._verdicts))

    # --- how a part is judged -------------------------------------------------------------------------
    def _learner_namespace(self) -> Mapping[str, Any]:
        if self._namespace is not None:
            return self._namespace
        shell = _kernel()
        if shell is not None and getattr(shell, "user_ns", None) is not None:
            return shell.user_ns
        frame = inspect.currentframe()
        while frame is not None and frame.f_globals.get("__name__") in (__name__, "functools"):
            frame = frame.f_back
        return frame.f_globals if frame is not None else {}

    def _judge(self, part: Part, obj: Any, notes: list[str]) -> PartVerdict:
        if not callable(obj):
            return failed_part(part, f"expected your function `{part.function}` itself, got {describe(obj)}; "
                                     f"call check.{part.name}({part.function})", kind=FailureKind.TYPE)
        seed = self._seed if self._seed is not None else _fresh_seed()
        own = cell_source(obj)
        by_cell = self._cells_by_id(notes)
        if self._isolated is False or (own is None and by_cell is None and not self._isolated):
            self._say_once(notes, "in-process",
                           "(Checked in this process: the source of your cell is not known here, so this check "
                           "cannot run it the way the grader does; in a notebook it can.)")
            cases = part.make_cases(torch.Generator().manual_seed(seed))
            outcomes = [outcome_of_call(functools.partial(part.run, obj, case)) for case in cases]
            return dataclasses.replace(judge_part(part, cases, outcomes), all_or_nothing=part.all_or_nothing)
        return self._judge_isolated(part, obj, seed, notes, by_cell)

    def _cells_by_id(self, notes: list[str]) -> _ByCell | None:
        """The graded cells as the grader will choose them, where the kernel knows which cell is which (the
        front end sent this check's cell id, and the cells run carry the handed-out ids); else ``None``, and
        the check says once what the grader will read instead."""
        shell = _kernel()
        if shell is None or self._namespace is not None:
            return None
        log = CellLog.install(shell)
        if log is not None and log.current is not None and log.knows(self._exercise):
            return _by_cell(log, self._exercise, shell)
        if log is None or log.current is None:
            why = "your front end does not send the id of the cell it runs (plain IPython, older front ends)"
        else:
            why = ("the cells you ran do not carry the handed-out notebook's cell ids (your front end sends ids of "
                   "its own, or this notebook is a copy or an older version)")
        self._say_once(notes, "no-cell-ids", NO_CELL_IDS.format(why=why))
        return None

    def _graded_sources(self, part: Part, obj: Any, notes: list[str]) -> dict[str, str]:
        """part -> source of the cell that defined its function in this kernel (``obj`` for ``part``)."""
        namespace = self._learner_namespace()
        sources: dict[str, str] = {}
        seen: set[str] = set()
        for other in self._exercise.parts:
            found = cell_source(obj if other is part else namespace.get(other.function))
            if found is None or found[0] in seen:
                continue
            seen.add(found[0])
            sources[other.name] = found[1]
        if part.name not in sources:  # isolated=True outside a kernel: the function's own source
            try:
                sources[part.name] = inspect.getsource(obj)
            except (OSError, TypeError):
                pass
        return sources

    def _judge_isolated(self, part: Part, obj: Any, seed: int, notes: list[str],
                        by_cell: _ByCell | None = None) -> PartVerdict:
        from attention_course.grading import sandbox

        exercise = self._exercise
        shell = _kernel()
        if by_cell is not None:  # the cells the grader will read, by cell id
            sources = dict(by_cell.sources)
            others = by_cell.others
            if part.name not in sources:
                index = self._part_names().index(part.name) + 1
                state = ("was deleted: the grader finds no graded cell for it and gives it no marks"
                         if part.name in by_cell.deleted else
                         "has not been run in this kernel; the grader reads only that cell, so run it, then this "
                         "check")
                return failed_part(part, f"the graded cell of part {index} (under its heading, where you write "
                                         f"`{part.function}`) {state}", kind=FailureKind.MISSING)
            own = cell_source(obj)
            if own is not None and not _same_code(shell, own[1], sources[part.name]):
                notes.append(f"Note: the `{part.function}` you passed was defined in another cell than this part's "
                             f"graded cell. The grader reads only the graded cell (under the part's heading), so "
                             f"this check judges that cell as you last ran it: move your answer there.")
            if part.name in by_cell.doubled:
                notes.append(f"Note: this notebook has more than one graded cell for this part: the grader grades "
                             f"the last one in the notebook that defines `{part.function}`; this check judged the "
                             f"one you ran last. Delete the others.")
        else:
            sources = self._graded_sources(part, obj, notes)
            others = _history(shell) if shell is not None else []
        if part.name not in sources:
            return failed_part(part, f"the cell that defines `{part.function}` could not be found; run it again",
                               kind=FailureKind.MISSING)
        # Plain functions and imports from the learner's other cells travel with the graded cells, as in the
        # grader (which reads them from the notebook; here they come from the cells the kernel ran: by cell id,
        # those not deleted since; without cell ids, its whole history of inputs).
        namespace = self._learner_namespace()
        carried = carried_definitions(sources, others, exercise.preamble, [p.function for p in exercise.parts])
        carried = {name: found for name, found in carried.items() if all(n in namespace for n in found[1])}
        sources = {name: with_carried(source, carried.get(name)) for name, source in sources.items()}
        ordered = [(index, p.name, sources[p.name]) for index, p in enumerate(exercise.parts) if p.name in sources]
        involved = [part, *dependencies(exercise, sources).get(part.name, [])]
        brought = list(dict.fromkeys(n for p in involved for n in carried.get(p.name, ("", []))[1]))
        if brought:
            names = ", ".join(f"`{name}`" for name in brought)
            notes.append(f"Note: the graded code of this part uses {names} from another cell: the grader carries "
                         f"plain functions and imports from your other cells into the graded run, and so does this "
                         f"check. Anything else (a variable, a class) it does not carry: keep that in a graded cell.")
            if by_cell is not None and not by_cell.tracks_deletions:
                self._say_once(notes, "deletions",
                               "(Your front end does not tell the kernel which cells you delete: the grader carries "
                               "a helper only from a cell still in the notebook you submit.)")
        # What the grader will not see: names from other cells it does not carry, an edited check cell.
        missing = sorted(name for name in outside_names([s for _, _, s in ordered], exercise.preamble,
                                                         [sources[p.name] for p in involved if p.name in sources])
                         if name in namespace)
        # Names only a deleted cell defined: the kernel still has them, the saved notebook does not.
        deleted = [] if by_cell is None else [name for name in missing if _defined_only_in(name, by_cell)]
        if deleted:
            names = ", ".join(f"`{name}`" for name in deleted)
            notes.append(f"Warning: the graded code of this part uses {names}, defined in a cell you deleted. The "
                         f"kernel still has it, but the grader reads the saved notebook and carries helpers only "
                         f"from cells still in it, so this part fails there, as it does here: restore the cell, or "
                         f"move the helper into the graded cell.")
        missing = [name for name in missing if name not in deleted]
        if missing:
            names = ", ".join(f"`{name}`" for name in missing)
            notes.append(f"Warning: the graded code of this part uses {names}, defined in a cell the grader does not "
                         f"run. The grader runs only the graded cells, after the exercise's own imports, and carries "
                         f"only plain functions and imports from other cells: move what you need into a graded cell "
                         f"(a helper next to the function that uses it), or this part fails there, as it does here.")
        check_cells = None
        current = _current_cell(shell) if shell is not None else None
        if current is not None and "check." in current:
            check_cells = {p.name: True for p in exercise.parts}
            check_cells[part.name] = check_cell_ok(current, part.name, part.function,
                                                   [p.function for p in exercise.parts])
        # Run this part and the earlier parts it calls (to name them as the cause when they fail).
        wanted = {part.name} | {dep.name for dep in dependencies(exercise, sources).get(part.name, [])}
        generator = torch.Generator().manual_seed(seed)
        cases = {p.name: p.make_cases(generator) for p in exercise.parts}
        cases = {name: cases[name] for name in wanted if name in sources}
        to_run = [(p.name, cases[p.name]) for p in exercise.parts if p.name in cases]
        limit = self._time_limit or part.time_limit or NOTEBOOK_TIME_LIMIT
        # One zygote per kernel (reuse): each check forks a fresh process from it instead of importing PyTorch
        # again; the grader gives each notebook a sandbox of its own and runs the same job protocol.
        result = sandbox.run_parts(exercise.id, exercise.preamble, ordered, to_run, timeout=limit, isolation="auto",
                                   allowed=exercise_allowed(exercise.id), reuse=True)
        isolated_by_os = getattr(result, "isolated", None)
        if isolated_by_os is False:
            self._say_once(notes, "unisolated",
                           "(This platform has no bubblewrap sandbox, so your cells run in a fresh process "
                           "without operating-system isolation; the grader runs them the same way, isolated.)")
        verdicts = {v.part: v for v in assemble(exercise, sources, cases, result, check_cells)}
        # The course-library rule, as the grader applies it (library_rules): a cell using a name its part may
        # not use earns nothing.
        aliases = library_aliases([exercise.preamble, *(source for _, _, source in ordered)])
        problem = library_problem(sources[part.name], exercise.id, part.name, aliases)
        verdict = verdicts[part.name]
        if problem:
            verdict = failed_part(part, f"no marks: {problem}", kind=FailureKind.FORBIDDEN)
        # Once every part passes, stop the zygote: a finished notebook would keep it for nothing (a later
        # check starts another).
        latest = {**self._verdicts, part.name: verdict}
        if all(name in latest and latest[name].passed for name in self._part_names()):
            sandbox.release(isolation="auto")
        return verdict

    def _say_once(self, notes: list[str], key: str, text: str) -> None:
        if key not in self._said:
            self._said.add(key)
            notes.append(text)

    # --- help and progress --------------------------------------------------------------------------
    def hint(self, part_name: str | int, level: int = 1) -> None:
        """Print hint ``level`` for part ``part_name`` (1: the concept, 2: the approach)."""
        part = self._part(part_name)
        if part is not None:
            print(format_hint(part, level))

    def progress(self) -> None:
        """Print every part with its status, and the points so far."""
        print(format_overview(self._exercise, self._verdicts))

    def passed(self, part_name: str) -> bool:
        """Whether the last check of ``part_name`` passed."""
        verdict = self._verdicts.get(self._exercise.part(part_name).name)
        return verdict is not None and verdict.passed

    def assert_all_passed(self) -> None:
        """Raise ``AssertionError`` naming the parts not passed (solution notebooks end with this)."""
        missing = [part.name for part in self._exercise.parts if not self.passed(part.name)]
        if missing:
            raise AssertionError(f"{self._exercise.id}: parts not passed (or not checked): {missing}")
        print(f"All {len(self._exercise.parts)} parts of {self._exercise.id} pass.")

    def __repr__(self) -> str:
        return format_overview(self._exercise, self._verdicts)


def exercise(exercise_id: str, seed: int | None = None, time_limit: float | None = None) -> Checker:
    """The checks for exercise ``exercise_id`` (e.g. ``"ex02"``, ``"bug_hunt"``).

    Example:
        >>> check = exercise("ex02")
        >>> check.soft_attention_weights(soft_attention_weights)   # doctest: +SKIP
    """
    checker = Checker(get_exercise(exercise_id), seed=seed, time_limit=time_limit)
    ex = checker._exercise
    CellLog.install(_kernel())  # from now on, note which cell each run was (where the front end says so)
    if _kernel() is not None:  # in a notebook: start the first check's worker while the learner writes code
        from attention_course.grading import sandbox

        try:
            sandbox.prewarm(reuse=True)
        except Exception:  # a check starts its own worker anyway
            pass
    print(f"Checks for {ex.id} ({ex.title}) are ready: {len(ex.parts)} parts, {ex.max_score} points. "
          f"Each check runs your graded cells the way the grader does. Run check.progress() at any time.")
    return checker

