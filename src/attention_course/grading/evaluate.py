"""From a learner's graded cells to one verdict per part: the step the grader and the notebook check share.

The grader (:func:`attention_course.grading.grader.grade_notebook`) and the check a learner runs in the
notebook (:class:`attention_course.grading.checker.Checker`) both

1. take the graded cells (from the notebook file, or from the kernel as the learner last ran them),
2. run the exercise's trusted preamble and those cells in a fresh process
   (:func:`attention_course.grading.sandbox.run_parts`), which calls the learner's functions on the cases,
3. and turn what came back into verdicts with :func:`assemble` (this module): cell errors, missing
   functions, the check-cell rule, time limits, and the cause of a failure that lies in an earlier part.

So the score a learner sees in the notebook is the score the grader gives, computed by the same code on
the same kind of inputs. :func:`dependencies` and :func:`outside_names` find what a graded cell uses, so the
notebook check can say, in words, when the learner's code depends on a cell the grader will not run.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import re
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from attention_course.grading.findings import FailureKind
from attention_course.grading.judge import NOT_ATTEMPTED, PartVerdict, failed_part, judge_part
from attention_course.grading.learner_text import parse
from attention_course.grading.spec import Case, Exercise, Part

__all__ = [
    "AnalysisTimeout",
    "CARRY_DEADLINE",
    "CHECK_CELL_EDITED",
    "CARRIED_MARK",
    "assemble",
    "bound_names",
    "carried_definitions",
    "carried_note",
    "check_cell_ok",
    "dependencies",
    "exercise_mismatch",
    "loaded_names",
    "outside_names",
    "with_carried",
]

#: How the verdict of a part lost to an edited or deleted check cell begins (its code was not judged, so
#: feedback gives no hint for it: see :func:`attention_course.grading.report.feedback_markdown`).
CHECK_CELL_EDITED = "its check cell was edited or deleted"
_MISSING = "missing"  # sandbox.MISSING, repeated so that this module imports nothing that starts processes
_TIME_LIMIT = re.compile(r"did not finish within the time limit of ([0-9.eE+-]+) s")


# --- what a cell defines and uses ---------------------------------------------------------------------
def _parse(source: str) -> ast.Module | None:
    return parse(source)  # IPython syntax read in one bounded pass (learner_text)


def _names_of(tree: ast.AST) -> tuple[set[str], set[str]]:
    """``(loaded, bound)`` from one walk of ``tree``: the names it reads, and every name it binds anywhere
    (assignments, defs, classes, imports, arguments, loop targets, exception names, ``global``/``nonlocal``
    declarations)."""
    loaded: set[str] = set()
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
    return loaded, bound


def _bound_in(tree: ast.AST) -> set[str]:
    """Every name ``tree`` binds anywhere (:func:`_names_of`'s rules)."""
    return _names_of(tree)[1]


def bound_names(source: str) -> set[str]:
    """Every name the cell binds anywhere (assignments, defs, classes, imports, arguments, loop targets)."""
    tree = _parse(source)
    return set() if tree is None else _bound_in(tree)


def loaded_names(source: str) -> set[str]:
    """Every name the cell reads (``np`` in ``np.zeros``, ``helper`` in ``helper(x)``)."""
    tree = _parse(source)
    if tree is None:
        return set()
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


def outside_names(cells: Sequence[str], preamble: str, reading: Sequence[str] | None = None) -> set[str]:
    """Names the graded ``cells`` (or only those in ``reading``) read but neither the cells, the ``preamble``
    nor Python's builtins define: in the grader's process they do not exist (a helper or an import in
    another cell of the notebook)."""
    defined = bound_names(preamble) | set(dir(builtins)) | {"__name__", "__file__", "get_ipython", "display"}
    for source in cells:
        defined |= bound_names(source)
    used: set[str] = set()
    for source in cells if reading is None else reading:
        used |= loaded_names(source)
    return used - defined


def dependencies(exercise: Exercise, cells: Mapping[str, str]) -> dict[str, list[Part]]:
    """For each part, the earlier parts whose functions its graded cell calls (and does not define itself),
    so that a failure there can be named as the cause: ``{"combine": [<Part softmax>]}``."""
    found: dict[str, list[Part]] = {}
    for index, part in enumerate(exercise.parts):
        source = cells.get(part.name)
        if source is None:
            continue
        used, own = loaded_names(source), bound_names(source)
        found[part.name] = [
            earlier for earlier in exercise.parts[:index]
            if earlier.function in used and earlier.function not in own
        ]
    return found


# --- the check-cell rule --------------------------------------------------------------------------------
def _is_the_check_call(node: ast.stmt, part: str, function: str) -> bool:
    """Whether ``node`` is the statement ``check.<part>(<function>)``, optionally with ``hint=True``/``False``."""
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return False
    call = node.value
    return (isinstance(call.func, ast.Attribute) and call.func.attr == part
            and isinstance(call.func.value, ast.Name) and call.func.value.id == "check"
            and len(call.args) == 1 and isinstance(call.args[0], ast.Name) and call.args[0].id == function
            and all(keyword.arg == "hint" and isinstance(keyword.value, ast.Constant)
                    and isinstance(keyword.value.value, bool) for keyword in call.keywords)
            and len(call.keywords) <= 1)


def check_cell_ok(source: Any, part: str, function: str, functions: Sequence[str] = ()) -> bool:
    """Whether ``source`` still is the part's check cell: it calls ``check.<part>(<function>)`` (optionally with
    ``hint=True``/``False``) once, as a statement of its own. Other lines are allowed (a debug ``print``, a
    comment, a timing), as long as none of them touches ``check`` or binds a name that matters to the check:
    ``check``, ``exercise``, ``function`` or any of the exercise's ``functions`` (a cell that redefines the
    function before checking it would be judging other code than the graded cell's)."""
    if not isinstance(source, str):
        return False
    tree = _parse(source)
    if tree is None:
        return False
    calls = [node for node in tree.body if _is_the_check_call(node, part, function)]
    if len(calls) != 1:
        return False
    protected = {"check", "exercise", function, *functions}
    for node in tree.body:
        if node is calls[0]:
            continue
        names = {child.id for child in ast.walk(node) if isinstance(child, ast.Name)}
        bound = _bound_in(node)
        if "check" in names or bound & protected:
            return False
    return True


# --- helpers and imports from the learner's other cells ----------------------------------------------
class AnalysisTimeout(TimeoutError):
    """The carried-definitions analysis passed its deadline (a notebook of very many helpers)."""


#: Seconds the grader gives the analysis of one notebook's other cells (:func:`carried_definitions`).
CARRY_DEADLINE = 5.0


def _uses(tree: ast.AST) -> frozenset[str]:
    """The names ``tree`` reads and does not bind itself, from one walk (:func:`_names_of`)."""
    loaded, bound = _names_of(tree)
    return frozenset(loaded - bound)


def _definitions(source: str) -> list[tuple[str, ast.stmt, frozenset[str]]]:
    """``(name, statement, uses)`` for each top-level plain function definition (no decorator) and each import
    (one statement per name bound; no ``*``, no relative import) of a cell, in order; ``uses`` are the
    names the statement reads and does not bind itself (read from the one parse of the cell)."""
    tree = _parse(source)
    found: list[tuple[str, ast.stmt, frozenset[str]]] = []
    if tree is None:
        return found
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.decorator_list:
            found.append((node.name, node, _uses(node)))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found.append(((alias.asname or alias.name).split(".")[0], ast.Import(names=[alias]), frozenset()))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if alias.name != "*":
                    statement = ast.ImportFrom(module=node.module, names=[alias], level=0)
                    found.append((alias.asname or alias.name, statement, frozenset()))
    return found


def carried_definitions(graded: Mapping[str, str], others: Sequence[str], preamble: str,
                        functions: Sequence[str] = (), deadline: float | None = None) \
        -> dict[str, tuple[str, list[str]]]:
    """What of the learner's other cells each graded cell needs: part -> ``(code, names)``, where ``code`` holds
    the top-level plain ``def``s and imports (from ``others``, the last definition of a name winning, as in a
    kernel run top to bottom) that the part's cell uses and neither the graded cells nor the preamble define,
    with the helpers those helpers use. Parts that need nothing are absent.

    The code is put at the top of the part's own graded cell (see :func:`with_carried`), so it runs under that
    part's rules: the run-time import guard and the library rule read it as the part's code. Nothing else is
    carried (no assignment, class or decorated function), and no name the check relies on (``check``,
    ``exercise``, the exercise's ``functions``).

    Each cell is parsed once and each definition visited once per part: the work is linear in the size of
    the cells (for a fixed number of parts). ``deadline`` (a ``time.monotonic()`` value): past it, between
    two cells or two definitions, :class:`AnalysisTimeout` is raised.

    Raises:
        AnalysisTimeout: the deadline passed.
    """
    import time

    def in_time() -> None:
        if deadline is not None and time.monotonic() > deadline:
            raise AnalysisTimeout("the analysis of the notebook's other cells passed its deadline")

    defined = bound_names(preamble) | set(dir(builtins)) | {"__name__", "__file__", "get_ipython", "display"}
    for source in graded.values():
        defined |= bound_names(source)
    protected = {"check", "exercise", *functions}
    available: dict[str, tuple[ast.stmt, frozenset[str]]] = {}
    for source in others:
        in_time()
        for name, statement, uses in _definitions(source):
            if name not in defined and name not in protected:
                available[name] = (statement, uses)  # the last definition wins
    carried: dict[str, tuple[str, list[str]]] = {}
    for part, source in graded.items():
        wanted = deque(sorted(loaded_names(source) - defined))
        names: set[str] = set()
        steps = 0
        while wanted:
            name = wanted.popleft()
            if name in names or name not in available:
                continue
            names.add(name)
            steps += 1
            if steps % 256 == 0:
                in_time()
            wanted.extend(sorted(available[name][1] - defined - names))
        if names:
            ordered = [name for name in available if name in names]  # notebook order
            texts = {name: ast.unparse(available[name][0]) for name in ordered}
            imports = [texts[n] for n in ordered if not isinstance(available[n][0], ast.FunctionDef)]
            defs = [texts[n] for n in ordered if isinstance(available[n][0], ast.FunctionDef)]
            carried[part] = ("\n".join([*imports, *defs]) + "\n", ordered)
    return carried


#: The line that starts the code carried into a graded cell.
CARRIED_MARK = "# carried into the graded run from your other cells:"


def with_carried(source: str, carried: tuple[str, list[str]] | None) -> str:
    """The graded cell ``source`` with the code :func:`carried_definitions` found for it at its top."""
    if not carried:
        return source
    return f"{CARRIED_MARK} {', '.join(carried[1])}\n{carried[0]}\n{source}"


def carried_note(carried: Mapping[str, tuple[str, list[str]]]) -> str:
    """What the learner is told about the code carried in, or ``""``."""
    if not carried:
        return ""
    names = ", ".join(f"`{name}`" for name in dict.fromkeys(n for _, found in carried.values() for n in found))
    return (f"{names} from your other cells (a function definition or an import) carried into the graded run; "
            f"the grader carries only plain functions and imports: keep anything else your graded code needs "
            f"in its graded cell")


def exercise_mismatch(chosen: str, metadata_id: str | None, forced: bool, guessed: str | None = None) -> str | None:
    """A sentence when the notebook's metadata names another exercise than the one it is graded as (refused
    with ``--exercise``), or than the one its file name suggests (``guessed``; graded by the metadata)."""
    if metadata_id is not None and metadata_id != chosen and forced:
        return (f"this notebook is exercise {metadata_id} (its metadata says so), not {chosen}: it was not graded; "
                f"grade it without --exercise, or with --exercise {metadata_id}")
    if metadata_id is not None and guessed is not None and guessed != metadata_id:
        return f"warning: the file name suggests {guessed}, but the notebook's metadata names {metadata_id}"
    return None


# --- verdicts ---------------------------------------------------------------------------------------------
def _amend(verdict: PartVerdict, extra: str) -> PartVerdict:
    return dataclasses.replace(verdict, message=verdict.message + extra)


def _failure_message(part: Part, failure: str) -> str:
    limit = _TIME_LIMIT.search(failure)
    if limit:
        return f"your function `{part.function}` did not return within {limit.group(1)} s (an infinite loop?)"
    return failure


def assemble(
    exercise: Exercise,
    cells: Mapping[str, str],
    cases: Mapping[str, Sequence[Case]],
    result: Any,
    check_cells: Mapping[str, bool] | None = None,
    all_or_nothing: bool = False,
) -> list[PartVerdict]:
    """One verdict per part of ``exercise`` from what the learner's process sent back.

    Args:
        exercise: the exercise.
        cells: part name -> source of its graded cell (parts without one earn nothing).
        cases: part name -> the cases generated for it (only parts that were run).
        result: the :class:`~attention_course.grading.sandbox.SandboxResult`.
        check_cells: part name -> whether its check cell is as handed out (``None``: not known, not applied).
        all_or_nothing: a part scores its points only if every case passes (default: per case).
    """
    verdicts: dict[str, PartVerdict] = {}
    for part in exercise.parts:
        cell_error = result.cell_errors.get(part.name)
        failure = result.failures.get(part.name, "no result came back")
        if part.name not in cases:
            continue
        if part.name not in cells:
            verdict = failed_part(part, f"no graded cell for part {part.name!r} was found (was it deleted, or its "
                                        "tag removed?)", kind=FailureKind.MISSING)
        elif part.name in result.outcomes:
            verdict = judge_part(part, cases[part.name], result.outcomes[part.name])
            if cell_error and not verdict.passed and verdict.status != NOT_ATTEMPTED:
                verdict = _amend(verdict, f" (running its graded cell {_failure_message(part, cell_error)})")
        elif failure == _MISSING:
            verdict = failed_part(part, f"your graded cell {_failure_message(part, cell_error)}, so "
                                        f"`{part.function}` was never defined"
                                  if cell_error else
                                  f"no function named `{part.function}` was defined (was it renamed?)",
                                  kind=FailureKind.MISSING)
        else:
            kind = FailureKind.TIME_LIMIT if _TIME_LIMIT.search(failure) else FailureKind.NO_RESULT
            verdict = failed_part(part, _failure_message(part, failure), kind=kind)
        if check_cells is not None and part.name in cells and not check_cells.get(part.name, False):
            # The rules say so: a part whose check was edited or deleted earns nothing, whatever its code.
            verdict = failed_part(part, f"{CHECK_CELL_EDITED}; restore the cell "
                                        f"`check.{part.name}({part.function})` to earn this part's marks",
                                  kind=FailureKind.CHECK_EDITED)
        verdicts[part.name] = dataclasses.replace(verdict, all_or_nothing=all_or_nothing or part.all_or_nothing)
    # Cause attribution: a part that calls an earlier part's function which fails says so first.
    index = {part.name: number for number, part in enumerate(exercise.parts, start=1)}
    for name, earlier in dependencies(exercise, cells).items():
        verdict = verdicts.get(name)
        if verdict is None or verdict.passed:
            continue
        for dep in earlier:
            dep_verdict = verdicts.get(dep.name)
            if dep_verdict is None or dep_verdict.passed:
                continue
            state = "is not written yet" if dep_verdict.status == NOT_ATTEMPTED else "fails"
            verb = "write" if dep_verdict.status == NOT_ATTEMPTED else "fix"
            cause = (f"part {index[name]} uses your {dep.function} from part {index[dep.name]}, which {state}; "
                     f"{verb} part {index[dep.name]} first")
            verdicts[name] = dataclasses.replace(verdict, cause=cause, message=f"{cause}. {verdict.message}")
            break
    return [verdicts[part.name] for part in exercise.parts if part.name in verdicts]
