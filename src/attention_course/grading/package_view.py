"""The library rule at the filesystem: each sandbox sees a view of the course package, not the package.

A learner's graded cells run in a sandbox (:mod:`attention_course.grading.isolation`). There, the
``attention_course`` folder is not the real package but a **view**: a read-only folder, made by the grader's
process, holding only

- a generated, minimal ``attention_course/__init__.py`` and ``attention_course/grading/__init__.py`` (the
  real ones import the whole library and the whole grader). The package defines no library name: the
  worker puts the job's allowed ones on it, and any other ``ac.X`` raises ``AttributeError`` saying the
  part may not use it;
- the grading worker's own modules (:data:`WORKER_MODULES`: the worker, its channel, the wire format, the
  run-time guard, the exercise declarations);
- the exercise's own module (with its ``.toml`` texts) and the course modules its import lines name at
  module level, recursively (its *sandbox side*: the part runners and what they call; the references are
  imported lazily, by :func:`instructor_side`, only in the grader's process, where the verdicts are
  computed);
- the modules the job's pickled cases name (a case whose input is a library object, ex10's decoder
  sub-layers, needs that object's module to be read);
- the modules of the course-library names the job's allowance lets its parts use (ex10's ``causal_mask``:
  ``attention_course/masks.py``), each with what it imports.

A module outside that set has no file in the sandbox, so no code there can import it, whatever it writes
into its own process's memory: ``importlib.util.find_spec("attention_course.alibi")`` is ``None`` in ex14.
Parts with different allowances are judged by different workers (``sandbox._allowance_groups``), each with
the view of its own allowance. A module in the view that a part may not use (ex10's ``layers.py``, which
its cases need) is kept from learner code by the run-time guard only
(:mod:`attention_course.grading.import_guard`): that, PyTorch's own functions, and grading without a
sandbox (``--no-sandbox``: no view at all) are the rule's limits (``chapters/instructors.md`` has the table).

How: every isolated sandbox gets a folder of its own (:func:`new_view`, in the sandbox's private folder),
bound read-only at the package's path in place of the package. It starts with the worker's modules only,
which is all the worker imports before it knows its job; the grader adds the job's modules with
:func:`fill_view` before it sends the job (the zygote of the notebook check gets its view refilled before
each job). Files are hard links to a private copy of the package's files made once per grader process
(``_mirror``), so that filling a view costs a few links.
"""

from __future__ import annotations

import ast
import atexit
import functools
import importlib
import importlib.util
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["WORKER_MODULES", "fill_view", "instructor_side", "library_sources", "module_files", "new_view",
           "pickle_modules", "view_modules"]

PACKAGE = "attention_course"
#: Every view holds these, the grading worker's own modules (the worker imports them before it knows its job).
WORKER_MODULES = tuple(f"{PACKAGE}.grading.{name}" for name in (
    "worker", "channel", "learner_text", "wire", "import_guard", "spec", "declare", "compare", "findings",
    "exercises", "package_view"))

#: Package ``__init__`` files the view replaces with its own (the real ones import everything).
GENERATED = {
    PACKAGE: '"""attention_course as a grading sandbox sees it: only the modules this job may use '
             '(attention_course.grading.package_view)."""\n\n__version__ = {version!r}\n\n\n'
             'def __getattr__(name):\n'
             '    if name.startswith("__"):\n'
             '        raise AttributeError(name)\n'
             '    raise AttributeError("ac." + name + " is not available to this part: the grader does not allow it to '
             'use the course library\'s version (its sandbox holds only what the part may use); write it yourself")\n',
    f"{PACKAGE}.grading": '"""The grading package as a grading sandbox sees it: the worker\'s own modules only '
                          '(attention_course.grading.package_view)."""\n',
}


def instructor_side(module: str, name: str) -> Any:
    """A stand-in for ``from <module> import <name>`` in an exercise module, for what only the grader's
    process uses (a reference, a verdict's helper, a case builder): it imports ``module`` on first use
    (a call or an attribute: ``Transformer(...)``, ``EncoderLayer.from_torch(...)``). The sandbox imports the
    exercise module too, for its part runners; there ``module`` is not in the view, and nothing uses the
    stand-in."""
    return _InstructorSide(module, name)


class _InstructorSide:
    """See :func:`instructor_side`."""

    __slots__ = ("_module", "_name")

    def __init__(self, module: str, name: str) -> None:
        self._module, self._name = module, name

    def _target(self) -> Any:
        return getattr(importlib.import_module(self._module), self._name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._target()(*args, **kwargs)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._target(), attribute)

    def __instancecheck__(self, instance: Any) -> bool:
        return isinstance(instance, self._target())

    def __subclasscheck__(self, subclass: type) -> bool:
        return issubclass(subclass, self._target())

    def __repr__(self) -> str:
        return f"<{self._module}.{self._name}, imported on first use (the grader's process only)>"


# --- which modules ------------------------------------------------------------------------------------
@functools.cache
def source_dir() -> Path:
    """The real package's folder (``.../attention_course``), in the grader's process."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:  # pragma: no cover - this module is part of the package
        raise RuntimeError("the attention_course package cannot be found")
    return Path(spec.origin).resolve().parent


def _relative(module: str) -> Path | None:
    """The file of ``module`` relative to the package's parent (``attention_course/masks.py``), or None."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    base = source_dir().parent.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return (base / "__init__.py").relative_to(source_dir().parent)
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py").relative_to(source_dir().parent)
    return None


def _is_package(module: str) -> bool:
    path = _relative(module)
    return path is not None and path.name == "__init__.py"


def _top_level(body: list[ast.stmt]) -> Iterable[ast.stmt]:
    """The statements that run when a module is imported (function bodies do not; class bodies do)."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With, ast.ClassDef)):
            for field in ("body", "orelse", "finalbody"):
                yield from _top_level(getattr(node, field, []) or [])
            for handler in getattr(node, "handlers", []) or []:
                yield from _top_level(handler.body)


@functools.cache
def _imports(module: str) -> frozenset[str]:
    """The course modules ``module`` imports when it is imported (module-level import lines)."""
    relative = _relative(module)
    if relative is None or module in GENERATED:
        return frozenset()
    tree = ast.parse((source_dir().parent / relative).read_text(encoding="utf-8"))
    here = module if relative.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _top_level(tree.body):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names if _relative(f"{target}.{alias.name}"))
    return frozenset(name for name in found if name.split(".")[0] == PACKAGE and _relative(name) is not None)


@functools.cache
def _closure(roots: frozenset[str]) -> frozenset[str]:
    """``roots``, their parent packages and everything they import, recursively (course modules only)."""
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        module = stack.pop()
        if module in seen or _relative(module) is None:
            continue
        seen.add(module)
        parts = module.split(".")
        stack += [".".join(parts[:i]) for i in range(1, len(parts))]
        stack += list(_imports(module))
    return frozenset(seen)


_NAMED = re.compile(rb"attention_course(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def pickle_modules(data: bytes) -> frozenset[str]:
    """The course modules named in a pickle's bytes: every module that unpickling it imports is among them
    (a ``GLOBAL`` or ``STACK_GLOBAL`` names its module as a plain string), each name cut to its longest
    prefix that is a module. Read without unpickling, in one regular-expression pass (the job is the
    grader's own pickle: a string in the cases that names a module can only add that module)."""
    found: set[str] = set()
    for match in set(_NAMED.findall(data)):
        parts = match.decode("ascii").split(".")
        for end in range(len(parts), 0, -1):
            name = ".".join(parts[:end])
            if _relative(name) is not None:
                found.add(name)
                break
    return frozenset(found)


@functools.cache
def library_sources(allowed: frozenset[str] | None) -> tuple[tuple[str, str], ...]:
    """For each course-library name in ``allowed``: ``(name, module that defines it)``, sorted (what the
    worker puts on its minimal ``attention_course`` package). A name that is a submodule maps to itself."""
    import types

    import attention_course

    pairs = []
    for name in sorted(allowed or ()):
        value = getattr(attention_course, name, None)
        if isinstance(value, types.ModuleType):
            pairs.append((name, value.__name__))
        elif value is not None and isinstance(getattr(value, "__module__", None), str):
            pairs.append((name, value.__module__))
    return tuple(pairs)


def view_modules(exercise_id: str, allowed: frozenset[str] | None, extra: Iterable[str] = ()) -> frozenset[str]:
    """The modules a job's view holds: the worker's, the exercise module's closure, ``extra`` (the modules
    its pickled cases name) and those of the names ``allowed`` (``None``: no rule, the whole package)."""
    if allowed is None:
        return frozenset({PACKAGE})  # marker: the whole package (see module_files)
    roots = {*WORKER_MODULES, f"{PACKAGE}.grading.exercises.{exercise_id}", *extra}
    roots.update(module for _, module in library_sources(frozenset(allowed)))
    return _closure(frozenset(roots))


@functools.cache
def module_files(modules: frozenset[str]) -> frozenset[str]:
    """The files (relative to the view's ``attention_course`` folder) that hold ``modules``: each one's
    source, its texts (``exNN.toml``) and, where there is one, its byte-compiled file for this interpreter."""
    if modules == frozenset({PACKAGE}):
        modules = frozenset(_all_modules())
    files: set[str] = set()
    tag = sys.implementation.cache_tag
    for module in modules:
        relative = _relative(module)
        if relative is None:
            continue
        inside = Path(*relative.parts[1:])
        files.add(str(inside))
        if module in GENERATED:
            continue
        text = inside.with_suffix(".toml")  # an exercise's texts (spec.with_texts reads them beside the module)
        if inside.name != "__init__.py" and (source_dir() / text).is_file():
            files.add(str(text))
        compiled = inside.parent / "__pycache__" / f"{inside.stem}.{tag}.pyc"
        if (source_dir() / compiled).is_file():
            files.add(str(compiled))
    return frozenset(files)


def _all_modules() -> list[str]:
    found = []
    for path in source_dir().rglob("*.py"):
        parts = path.relative_to(source_dir().parent).with_suffix("").parts
        found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


# --- the files ----------------------------------------------------------------------------------------
_lock = threading.Lock()
_mirror_dir: list[Path] = []


def _mirror(relative: str) -> Path:
    """The grader's private copy of one file of the view (made on first use; generated ``__init__`` files
    are written there): the source of the hard links every view gets."""
    with _lock:
        if not _mirror_dir:
            folder = Path(tempfile.mkdtemp(prefix=f"attention-course-grading-{os.getpid()}-view-"))
            _mirror_dir.append(folder)
            atexit.register(shutil.rmtree, folder, True)
        target = _mirror_dir[0] / relative
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(target.parent, 0o755)
            generated = _generated_file(relative)
            partial = target.with_name(target.name + ".part")
            if generated is not None:
                partial.write_text(generated, encoding="utf-8")
            else:
                shutil.copy2(source_dir() / relative, partial)
            os.chmod(partial, 0o444)
            os.replace(partial, target)
        return target


def _generated_file(relative: str) -> str | None:
    for module, text in GENERATED.items():
        path = _relative(module)
        if path is not None and str(Path(*path.parts[1:])) == relative:
            import attention_course

            return text.format(version=getattr(attention_course, "__version__", "0"))
    return None


def new_view(folder: str | Path) -> Path:
    """A view for one sandbox, in its private ``folder``: ``folder/view/attention_course`` with the worker's
    modules only (bind it read-only at the package's path; :func:`fill_view` adds a job's modules)."""
    view = Path(folder) / "view" / PACKAGE
    view.mkdir(parents=True)
    os.chmod(view.parent, 0o755)
    os.chmod(view, 0o755)
    fill_view(view, _closure(frozenset(WORKER_MODULES)))
    return view


def fill_view(view: Path, modules: frozenset[str]) -> None:
    """Make ``view`` hold exactly the files of ``modules`` (hard links to the grader's private copies): add
    what is missing, remove what is not in the set, so that a zygote's view serves its next job alone."""
    wanted = module_files(frozenset(modules))
    present: set[str] = set()
    for top, _folders, files in os.walk(view):
        for name in files:
            present.add(str((Path(top) / name).relative_to(view)))
    for relative in sorted(present - wanted):
        os.unlink(view / relative)
    for relative in sorted(wanted - present):
        target = view / relative
        if not target.parent.is_dir():
            target.parent.mkdir(parents=True)
            for parent in [target.parent, *target.parent.parents]:
                if parent == view:
                    break
                os.chmod(parent, 0o755)
        source = _mirror(relative)
        try:
            os.link(source, target)
        except OSError:  # another filesystem, or links refused here: a copy
            shutil.copy2(source, target)
