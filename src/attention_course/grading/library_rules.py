"""Which names of the course library a graded part may use, and how the grader enforces it.

The rule, part by part: a graded cell may use PyTorch (and the standard library) freely, but from the
course library (``attention_course``, usually imported as ``ac``) only the names its part allows. By
default a part allows **nothing**: the library holds a finished version of almost every exercise
(``ac.MultiHeadAttention`` would answer ex06), so calling it would earn marks for work not done. The
exceptions are building blocks from earlier chapters that a part is meant to reuse, listed in the
exercise's ``allowed`` table (e.g. ex10's decoder layer and greedy decoding may call ``ac.causal_mask``; ex09's encoder
layer is built from ``ac.MultiHeadAttention`` and ``ac.PositionwiseFeedForward``). The grading package
(``attention_course.grading``, which computes references) is never allowed.

An exercise module may also declare a module-level table, ``LIBRARY_ALLOWED = {"part": {"name", ...}}``,
which replaces its exercise's ``allowed``.

Enforcement has layers (``chapters/instructors.md`` has the table of what each holds against):

- :func:`library_problem` (in the grader, on the cell's source, IPython syntax and the bodies of cell
  magics such as ``%%time`` included): any use of a name the part does not allow (``ac.X``,
  ``from attention_course... import X``, the module itself passed around, ``getattr(ac, ...)``, or a string
  or bytes constant naming the package) fails the part with a message naming the use: the early, readable
  message;
- parts with different allowances are judged in separate sandboxes
  (:func:`attention_course.grading.sandbox.run_parts` groups them by :func:`part_table`), so a worker's
  allowance is fixed for its life;
- each sandbox sees a view of the package (:mod:`attention_course.grading.package_view`) holding only the
  worker's modules, the exercise's sandbox side, the modules its cases are made of and those of its
  group's allowance: any other module has no file there and cannot be imported, whatever the learner's
  code writes into memory;
- ``attention_course.grading.import_guard.guard_library`` (in the worker, before the learner's cells
  run): the names outside that allowance hidden and the other routes to the library (``__import__`` of a
  built name, ``importlib``, a ``sys.modules`` scan, the garbage collector, ``pickle``, frames, the
  package's files, another interpreter) refused by an audit hook: defence in depth, since code that writes
  its own process's memory can switch a hook off.
  (:func:`hide_library`, the earlier, name-only stand-ins, is kept for callers of the old form.)

It cannot catch a learner who copies the library's (public) source into a cell; that is plagiarism, not
an attack on the grader.
"""

from __future__ import annotations

import ast
import importlib
import types
from typing import Any

from attention_course.grading import learner_text

__all__ = ["ALLOWED", "MAGIC_BODY_LIMIT", "allowed_names", "part_table", "broken_parts", "exercise_allowed",
           "hide_library", "library_aliases",
           "library_problem", "rule_text"]

#: The course-library allowances of exercises that declare none of their own. Each exercise's registered
#: unit (its :class:`~attention_course.grading.spec.Exercise`'s ``allowed``) is where the course's parts say
#: theirs, so this table is empty.
ALLOWED: dict[str, dict[str, frozenset[str]]] = {}

_PACKAGE = "attention_course"


def _table(exercise_id: str) -> dict[str, frozenset[str]]:
    try:
        module = importlib.import_module(f"{_PACKAGE}.grading.exercises.{exercise_id}")
        declared = getattr(module, "LIBRARY_ALLOWED", None)
        if declared is None and getattr(getattr(module, "EXERCISE", None), "allowed", None):
            declared = dict(module.EXERCISE.allowed)
    except Exception:
        declared = None
    if isinstance(declared, dict):
        return {str(part): frozenset(map(str, names)) for part, names in declared.items()}
    return dict(ALLOWED.get(exercise_id, {}))


def part_table(exercise_id: str) -> dict[str, frozenset[str]]:
    """Part -> the course-library names it may use, for every part that may use some."""
    return _table(exercise_id)


def allowed_names(exercise_id: str, part: str) -> frozenset[str]:
    """The course-library names ``part`` of ``exercise_id`` may use."""
    return _table(exercise_id).get(part, frozenset())


def exercise_allowed(exercise_id: str) -> frozenset[str]:
    """The names some part of the exercise may use (what the worker leaves visible)."""
    names: set[str] = set()
    for allowed in _table(exercise_id).values():
        names |= allowed
    return frozenset(names)


def rule_text(exercise_id: str, part: str) -> str:
    allowed = sorted(allowed_names(exercise_id, part))
    if not allowed:
        return f"part {part} may not use the course library (attention_course); write it with PyTorch"
    return f"part {part} may use only {', '.join('ac.' + name for name in allowed)} from the course library"


def _submodules() -> set[str]:
    import attention_course

    return {name for name, value in vars(attention_course).items() if isinstance(value, types.ModuleType)}


def _parse(source: str) -> ast.Module | None:
    return learner_text.parse(source)  # IPython syntax read in one bounded pass


def library_aliases(sources: list[str]) -> set[str]:
    """The names that the preamble and graded cells bind to the course library or one of its modules
    (``ac`` from ``import attention_course as ac``); cells share one namespace, so all cells count."""
    aliases: set[str] = set()
    for source in sources:
        tree = _parse(source)
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == _PACKAGE:
                        aliases.add(alias.asname or _PACKAGE)
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == _PACKAGE:
                aliases.update(alias.asname or alias.name for alias in node.names
                               if alias.name in _submodules() | {"grading"})
    return aliases


def _constant_text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


#: Characters of one cell magic's body (``%%time``) the rule reads; a longer body breaks the rule.
MAGIC_BODY_LIMIT = 100_000


def _is_magic_call(node: ast.AST) -> bool:
    """``get_ipython().run_cell_magic(name, line, body)`` or ``.run_line_magic(name, line)`` with a
    constant body: what IPython's transformer makes of ``%%time`` or ``%timeit`` (the body runs as code)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("run_cell_magic", "run_line_magic") and len(node.args) >= 2
            and isinstance(node.args[-1], ast.Constant) and isinstance(node.args[-1].value, str))


def library_problem(source: str, exercise_id: str, part: str, aliases: set[str] | None = None,
                    _depth: int = 0) -> str | None:
    """Why the graded cell ``source`` of ``part`` breaks the library rule, or ``None`` if it does not.

    The bodies of cell and line magics (``%%time``, ``%timeit``) are read as code too, and bytes constants
    count as strings.

    Args:
        aliases: names bound to the library elsewhere (:func:`library_aliases` of the preamble and cells).
    """
    tree = _parse(source)
    if tree is None:
        return None  # it will not run either; the cell's own error is the message
    allowed = allowed_names(exercise_id, part)
    modules = _submodules() | {"grading"}
    aliases = set(aliases or ()) | library_aliases([source])

    def bad(use: str) -> str:
        return f"it uses {use}, which this part does not allow ({rule_text(exercise_id, part)})"

    def check_path(components: list[str], shown: str) -> str | None:
        for component in components:
            if component == "grading":
                return bad(f"the grader's own code ({shown})")
            if component in allowed:
                return None
            if component in modules:
                continue
            return bad(shown)
        return bad(f"the library module {shown} itself")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                root, *rest = alias.name.split(".")
                if root == _PACKAGE:
                    if "grading" in rest:
                        return bad(f"the grader's own code (import {alias.name})")
                    aliases.add(alias.asname or root)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == _PACKAGE:
            path = node.module.split(".")[1:]
            if "grading" in path:
                return bad(f"the grader's own code (from {node.module} import ...)")
            for alias in node.names:
                if alias.name == "*":
                    return bad(f"from {node.module} import *")
                problem = check_path([*path, alias.name], f"{node.module}.{alias.name}")
                if problem:
                    return problem
        elif isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) \
                and _PACKAGE in _constant_text(node.value):
            return bad(f"the string {node.value[:60]!r} (naming the course library)")
        elif _is_magic_call(node):
            body = node.args[-1].value  # type: ignore[attr-defined]
            if len(body) > MAGIC_BODY_LIMIT:
                return f"it holds a cell magic whose body is {len(body):,} characters (over {MAGIC_BODY_LIMIT:,})"
            problem = library_problem(body, exercise_id, part, aliases, _depth + 1) if _depth < 3 else \
                "it nests cell magics more than 3 deep"
            if problem:
                return problem
    attribute_roots: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in aliases:
                attribute_roots.add(id(value))
                chain.reverse()
                problem = check_path(chain, f"{value.id}.{'.'.join(chain)}")
                if problem:
                    return problem
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in aliases and isinstance(node.ctx, ast.Load) \
                and id(node) not in attribute_roots:
            return bad(f"the course library module `{node.id}` itself (getattr, vars, or passing it around)")
    return None


def broken_parts(exercise_id: str, preamble: str, cells: list[tuple[int, str, str]]) -> dict[str, str]:
    """Part -> why it earns nothing under the library rule, for the graded ``cells`` (``(index, part,
    source)``) of a notebook; parts that keep the rule are absent. The grader and the notebook check both
    use this, so they agree."""
    aliases = library_aliases([preamble, *(source for _, _, source in cells)])
    broken: dict[str, str] = {}
    for _, part, source in cells:
        problem = library_problem(source, exercise_id, part, aliases)
        if problem and part not in broken:
            broken[part] = f"no marks: {problem}"
    return broken


class _Hidden:
    """Stands in for a library name the exercise does not allow: any use raises ``PermissionError``."""

    def __init__(self, name: str, exercise_id: str) -> None:
        object.__setattr__(self, "_message",
                           f"ac.{name} is not available in {exercise_id}: the grader does not allow this exercise to "
                           "use the course library's version; write it yourself")

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise PermissionError(object.__getattribute__(self, "_message"))

    __call__ = _refuse

    def __getattr__(self, name: str) -> Any:
        self._refuse()

    def __repr__(self) -> str:
        return "<not available in this exercise>"


def hide_library(exercise_id: str, allowed: frozenset[str]) -> None:
    """In the worker: replace every public, non-module name of ``attention_course`` that no part of the
    exercise allows (and the grading package) with a stand-in that raises ``PermissionError`` when used."""
    import attention_course

    for name, value in list(vars(attention_course).items()):
        if name.startswith("_") or name in allowed:
            continue
        if isinstance(value, types.ModuleType) and name != "grading":
            continue
        setattr(attention_course, name, _Hidden(name, exercise_id))
