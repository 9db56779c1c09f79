"""The library rule at run time, inside the worker: defence in depth under the source check.

The source check (:func:`attention_course.grading.library_rules.library_problem`) gives the early, readable
message; this module refuses, at run time, the routes a cell can build that no source check reads
(``__import__("attention" + "_course.rotary")``, ``importlib.import_module(b"...".decode())``, a
``sys.modules`` scan, ``gc.get_objects()``, ``pickle.loads(b"c...\\n...\\n.")``). Each worker process serves
parts that share one allowance (the grader judges parts with different allowances in separate attempts,
see :func:`attention_course.grading.sandbox.run_parts`), so the rule is fixed for the process: nothing in
it says which part runs now, and no learner frame can reach a switch (ex10's ``ac.causal_mask`` is either
the library's function, in the attempts of the parts that may call it, or a stand-in that refuses, in
the others). Before the first learner cell runs, :func:`guard_library`:

1. **prunes** the course package in this process: every module dict of ``attention_course.*`` keeps only
   the names that the code the worker still has to run needs (each part's ``run``, the classes of the
   cases' inputs, the library names this attempt allows), found by following the names their code reads;
   everything else (references, other exercises, the library modules no part here may use) is deleted;
2. **hides** the package's public names this attempt does not allow behind stand-ins that raise
   ``PermissionError`` (classes included: ex09's ``feed_forward`` never sees ``PositionwiseFeedForward``);
3. **scrubs** ``sys.modules`` of every ``attention_course.*`` module (the package itself stays, hidden);
4. adds an **audit hook** (:pep:`578`; Python gives no way to remove one) that, for learner code, refuses:
   importing ``attention_course.*``; opening any file of the package or ``/proc/*/mem``; ``pickle``'s
   ``find_class`` of a course module; ``gc.get_objects``, ``get_referrers`` and ``get_referents``; every
   way to a frame (``sys._getframe``, ``tb_frame``, ``gi_frame``, ``cr_frame``, ``ag_frame``,
   ``sys._current_frames``, ``sys.settrace``, ``sys.setprofile``); ``ctypes``; starting another program;
   and a second audit hook. The hook keeps no state that says when to relax: the one exception is by code
   identity, the worker's own traceback walk (``wire.where``'s ``walk``, which reads file names and line
   numbers, runs no learner code and hands back no frame) may read ``tb_frame``.

What it does not stop, and what does: code in the learner's process can read and write that process's
memory without an audit event (NumPy's ``__array_interface__`` on a raw address, for one), and so can
unhook or rewrite this guard. An in-process guard cannot stand against that; it is defence in depth. What
holds whatever the learner writes into memory is outside the process: in a sandbox, the course package is
a view holding only the modules this job needs or allows (:mod:`attention_course.grading.package_view`:
a module that is not there cannot be imported), the parts of one attempt share one allowance, the
references and verdicts are computed in the grader's process (cases travel without their private data),
the sandbox (bubblewrap, seccomp) keeps the process from everything else, and the source check reads
every cell. For a module the view holds but a part may not use (one its cases need), this guard is the
only run-time barrier. It cannot catch a learner who copies the library's public source into a cell
(plagiarism, not an attack on the grader). ``chapters/instructors.md`` has the table of what holds how.
"""

from __future__ import annotations

import gc
import os
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["Guard", "guard_library"]

_PACKAGE = "attention_course"
#: Modules of the grading package the worker itself runs after the guard is installed (never pruned).
_INFRASTRUCTURE = frozenset({f"{_PACKAGE}.grading.{name}" for name in
                             ("worker", "wire", "spec", "channel", "import_guard", "library_rules", "learner_text")})
_FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
_REFUSED_EVENTS = frozenset({"gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
                             "sys.settrace", "sys.setprofile", "sys._getframe"})
#: Starting another program: a fresh interpreter would have no guard (and could import anything).
_EXEC_EVENTS = frozenset({"os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.startfile"})
#: Modules that start programs without an audit event of their own.
_EXEC_MODULES = frozenset({"_posixsubprocess"})


class LibraryRuleError(PermissionError):
    """What learner code gets when it takes a route the library rule closes."""


class FrameAccessRefused(ValueError):
    """Refused frame access: a ``ValueError``, which the standard library's ``sys._getframe`` callers
    (``collections.namedtuple``, ``typing``, ``enum``) already expect and handle."""


class _HookRefused(RuntimeError):
    """Refuses ``sys.addaudithook`` (a ``RuntimeError``: Python then silently does not add the hook)."""


def _is_course(name: object) -> bool:
    return isinstance(name, str) and (name == _PACKAGE or name.startswith(_PACKAGE + "."))


class Guard:
    """What the worker keeps of an installed guard.

    Attributes:
        intact: ``intact()``: whether ``sys.modules`` still looks as the guard left it.
    """

    __slots__ = ("intact",)

    def __init__(self, intact: Callable[[], bool]) -> None:
        self.intact = intact


def _frame_walkers() -> frozenset[types.CodeType]:
    """The code of the worker's own traceback walk (``wire.where``'s ``walk``): the one code that may read
    ``tb_frame``. It reads file names and line numbers only, runs no learner code and hands back no frame."""
    from attention_course.grading import wire

    return frozenset(const for const in wire.where.__code__.co_consts
                     if isinstance(const, types.CodeType) and const.co_name == "walk")


# --- pruning ------------------------------------------------------------------------------------------
def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _needed(roots: Iterable[Any]) -> dict[int, set[str]]:
    """For each module dict (by id), the global names the code reachable from ``roots`` reads."""
    keep: dict[int, set[str]] = {}
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (types.MethodType, staticmethod, classmethod)):
            stack.append(obj.__func__)
        elif isinstance(obj, property):
            stack += [obj.fget, obj.fset, obj.fdel]
        elif isinstance(obj, types.FunctionType):
            module_globals = obj.__globals__
            names = _code_names(obj.__code__) & module_globals.keys()
            keep.setdefault(id(module_globals), set()).update(names)
            stack += [module_globals[name] for name in names]
            stack += list(obj.__defaults__ or ()) + list((obj.__kwdefaults__ or {}).values())
            for cell in obj.__closure__ or ():
                try:
                    stack.append(cell.cell_contents)
                except ValueError:  # an empty cell
                    pass
        elif isinstance(obj, type):
            for klass in obj.__mro__:
                if _is_course(getattr(klass, "__module__", None)):
                    stack += list(vars(klass).values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack += list(obj)
        elif isinstance(obj, dict):
            stack += list(obj.values())
        elif hasattr(obj, "func") and hasattr(obj, "args") and callable(obj):  # functools.partial
            stack += [obj.func, *obj.args, *getattr(obj, "keywords", {}).values()]
        elif not isinstance(obj, (types.ModuleType, str, bytes, int, float, complex, bool, type(None))):
            kind = type(obj)
            if _is_course(kind.__module__):
                stack.append(kind)
                stack += list(getattr(obj, "__dict__", {}).values())
            modules = getattr(obj, "modules", None)
            if callable(modules) and hasattr(obj, "_modules"):  # an nn.Module: its submodules' classes too
                try:
                    stack += [type(module) for module in modules()]
                except Exception:
                    pass
    return keep


def _prune(roots: Iterable[Any]) -> None:
    """Delete from every ``attention_course.*`` module dict (except the worker's own) the names nothing the
    worker still runs reads."""
    keep = _needed(roots)
    for name, module in list(sys.modules.items()):
        if not _is_course(name) or name == _PACKAGE or name in _INFRASTRUCTURE:
            continue
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        kept = keep.get(id(namespace), set())
        for key in list(namespace):
            if key not in kept and not (key.startswith("__") and key.endswith("__")):
                del namespace[key]


# --- hiding the package's names -----------------------------------------------------------------------
class _Hidden:
    """Stands in for a course-library name: any use raises ``PermissionError``."""

    __slots__ = ("_message",)

    def __init__(self, message: str) -> None:
        object.__setattr__(self, "_message", message)

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise LibraryRuleError(object.__getattribute__(self, "_message"))

    __call__ = _refuse

    def __getattr__(self, name: str) -> Any:
        self._refuse()

    def __repr__(self) -> str:
        return "<not available in this exercise>"


# --- the guard ----------------------------------------------------------------------------------------
def guard_library(exercise_id: str, allowed: frozenset[str], roots: Iterable[Any]) -> Guard:
    """Install the run-time library rule in this process (the worker, before learner code); see the module
    docstring.

    Args:
        exercise_id: for messages.
        allowed: the course-library names every part this process serves may use (one allowance per
            process: the grader splits the parts by allowance).
        roots: what the worker will still run or hand to learner code: each part's ``run`` and the cases.
    """
    import attention_course

    package_dir = os.path.realpath(os.path.dirname(attention_course.__file__))
    union = frozenset(allowed)
    walkers = _frame_walkers()  # immutable: the hook keeps no state that could be switched

    allowed_objects = [value for name, value in vars(attention_course).items() if name in union]
    _prune([*roots, *allowed_objects])
    for name, value in list(vars(attention_course).items()):
        if name.startswith("_"):
            continue
        if name not in union or isinstance(value, types.ModuleType):
            setattr(attention_course, name, _Hidden(
                f"ac.{name} is not available in {exercise_id} to this part: the grader does not allow it to "
                "use the course library's version; write it yourself"))
    for name in [key for key in sys.modules if _is_course(key) and key != _PACKAGE]:
        del sys.modules[name]
    for name in _EXEC_MODULES:  # subprocess keeps a reference to the module: take the function off it
        module = sys.modules.pop(name, None)
        if module is not None and hasattr(module, "fork_exec"):
            delattr(module, "fork_exec")
    gc.collect()

    def refuse_path(path: object) -> bool:
        if isinstance(path, int):
            return False
        try:
            text = os.fsdecode(path)  # type: ignore[arg-type]
            real = os.path.realpath(text)
        except (TypeError, ValueError):
            return True
        parts = real.split("/")
        if len(parts) >= 4 and parts[1] == "proc" and parts[-1] == "mem":
            return True
        return real == package_dir or real.startswith(package_dir + os.sep)

    def trusted_code(frame: Any) -> bool:
        filename = getattr(getattr(frame, "f_code", None), "co_filename", "<none>")
        return (isinstance(filename, str) and not filename.startswith("<")
                and not os.path.realpath(filename).startswith(package_dir + os.sep))

    def library_frame(frame: Any) -> bool:
        """A frame that Python's or a package's own code asked for, for its own use (torch.manual_seed
        formats the stack; typing and namedtuple read a module name): the frame returned and the one
        that called it both run installed code, not the learner's and not the grader's; a frame walk
        (traceback.walk_stack) only when traceback itself consumes it."""
        caller = frame.f_back
        if not (trusted_code(frame) and trusted_code(caller)):
            return False
        if frame.f_code.co_name == "walk_stack":
            return os.path.basename(caller.f_code.co_filename) == "traceback.py"
        return True

    def walking() -> bool:
        """Whether the frame that triggered this event runs the worker's traceback walk (the hook's caller:
        its own ``sys._getframe`` call is let through below, as the frame it returns runs that walk)."""
        try:
            return sys._getframe(2).f_code in walkers
        except (ValueError, RuntimeError):
            return False

    def hook(event: str, args: tuple) -> None:
        if event == "sys.addaudithook":
            raise _HookRefused("graded code may not add audit hooks")
        if event == "import":
            if args and args[0] in _EXEC_MODULES:
                raise ImportError(f"graded code may not import {args[0]} (it starts other programs)")
            if args and _is_course(args[0]):
                raise ImportError(f"{args[0]} cannot be imported in {exercise_id}'s graded code (the course "
                                  "library's version is not allowed; write it yourself)")
        elif event == "open":
            if args and refuse_path(args[0]):
                raise LibraryRuleError("graded code may not read the course package's files")
        elif event == "pickle.find_class":
            if args and _is_course(args[0]):
                raise LibraryRuleError("graded code may not unpickle the course library's objects")
        elif event == "object.__getattr__":
            if len(args) > 1 and args[1] in _FRAME_ATTRIBUTES:
                if args[1] == "tb_frame" and walking():
                    return
                raise FrameAccessRefused(f"graded code may not inspect frames ({args[1]})")
        elif event in _REFUSED_EVENTS:
            if event == "sys._getframe":
                if args and (getattr(args[0], "f_code", None) in walkers or library_frame(args[0])):
                    return
                raise FrameAccessRefused("graded code may not inspect frames (sys._getframe)")
            raise LibraryRuleError(f"graded code may not use {event}")
        elif event.startswith("ctypes."):
            raise LibraryRuleError("graded code may not use ctypes")
        elif event in _EXEC_EVENTS:
            raise LibraryRuleError(f"graded code may not start other programs ({event})")

    sys.addaudithook(hook)

    def intact() -> bool:
        return not any(_is_course(key) and key != _PACKAGE for key in list(sys.modules))

    return Guard(intact)
