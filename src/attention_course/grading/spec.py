"""What an exercise is made of: parts, and the test cases each part runs.

An :class:`Exercise` (one per exercise notebook) lists its :class:`Part` objects in notebook order. A part
names the function the learner writes and knows three things:

- ``make_cases(generator)``: the inputs to try (fresh random ones each run plus fixed edge cases), as
  :class:`Case` objects. A case holds **inputs only**: it travels to the learner's process, so it must
  never carry the expected answer.
- ``run(obj, case)``: how to call the learner's function (or build the learner's class) on one case. It
  runs in the learner's process, so it only calls and returns, it never judges.
- ``verify(case, output)``: the verdict on one case, computed in the checking process from the case's
  inputs (references from PyTorch or the library, and properties): ``None`` for a pass, else a specific
  message such as ``"row 2 of your weights sums to 0.73"``, typed with its
  :class:`~attention_course.grading.findings.FailureKind` where it is a
  :class:`~attention_course.grading.findings.Finding`. Most parts declare it as data with
  :class:`attention_course.grading.declare.Check`.

The notebook check (:mod:`attention_course.grading.checker`) and the grader
(:mod:`attention_course.grading.grader`) both use these three functions, so a learner sees in the notebook
exactly the verdicts the instructor's grader will give.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attention_course.grading.findings import FailureKind, Finding

__all__ = ["Case", "Part", "Exercise", "Mistake", "call_function", "degenerate", "diagnose", "pair_problem",
           "permutation", "preamble", "randn", "with_texts", "INPUTS_CHANGED", "InputWatch", "unwatched"]

#: The key of the wrapper a part's ``run`` returns when the learner's function changed an input in place.
INPUTS_CHANGED = "__inputs_changed__"


@dataclass
class Case:
    """One input to try on the learner's function.

    Attributes:
        name: what the learner reads in the report, e.g. ``"scores ~ 1e4 (overflow test)"``. Keep random
            values out of it, so that a correct solution prints the same text on every run.
        args: positional arguments for the learner's function.
        kwargs: keyword arguments for the learner's function.
        data: anything else ``run`` or ``verify`` need (sizes, a state dict to load, a seed). Inputs only:
            this travels to the learner's process too.
        credit: whether the case counts for proportional credit. ``False`` for a degenerate case that the
            part's known mistakes pass too (no mask, a power-of-two head count, equal lengths, temperature
            0): it must still pass for full marks, but an answer right only on such cases earns nothing.
    """

    name: str
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    credit: bool = True

    def fresh_args(self) -> tuple[tuple, dict[str, Any]]:
        """Deep copies of ``args`` and ``kwargs``, so that a function that edits its inputs in place cannot
        change the inputs ``verify`` later computes the reference from. While a part runs the case, the
        copies handed out are remembered, so that an input changed in place is reported (see :class:`Part`)."""
        args, kwargs = copy.deepcopy(self.args), copy.deepcopy(self.kwargs)
        handed = self.__dict__.get("_handed_out")
        if handed is not None:
            handed.append((args, kwargs))
        return args, kwargs

    def changed_inputs(self, handed: list[tuple[tuple, dict[str, Any]]], obj: Any = None) -> list[str]:
        """Names of the arguments whose handed-out copies differ from the originals (edited in place);
        positional ones are named after ``obj``'s parameters when its signature tells."""
        try:
            parameters = list(inspect.signature(obj).parameters) if inspect.isfunction(obj) else []
        except (TypeError, ValueError):
            parameters = []
        names: list[str] = []
        for args, kwargs in handed:
            for index, (original, given) in enumerate(zip(self.args, args)):
                if _changed(original, given):
                    names.append(parameters[index] if index < len(parameters) else f"argument {index + 1}")
            for key, original in self.kwargs.items():
                if key in kwargs and _changed(original, kwargs[key]):
                    names.append(key)
        return list(dict.fromkeys(names))


def _changed(original: Any, given: Any, depth: int = 0) -> bool:
    """Whether ``given`` (a copy of ``original`` handed to the learner) no longer equals it."""
    if depth > 6:
        return False
    if isinstance(original, torch.Tensor):
        if not isinstance(given, torch.Tensor) or given.shape != original.shape or given.dtype != original.dtype:
            return True
        same = given == original
        if original.is_floating_point() or original.is_complex():
            same = same | (torch.isnan(given) & torch.isnan(original))
        return not bool(same.all())
    if isinstance(original, (list, tuple)):
        return (not isinstance(given, (list, tuple)) or len(given) != len(original)
                or any(_changed(a, b, depth + 1) for a, b in zip(original, given)))
    if isinstance(original, dict):
        return (not isinstance(given, dict) or given.keys() != original.keys()
                or any(_changed(original[key], given[key], depth + 1) for key in original))
    return False


def inputs_changed_message(names: Sequence[str]) -> str:
    """The verdict on a case whose inputs the learner's function changed in place."""
    quoted = ", ".join(f"`{name}`" for name in names)
    return Finding(f"your function changed its input {quoted} in place (e.g. `x /= ...`, `x += ...`, "
                   f"`x.masked_fill_(...)` or `x[...] = ...` on the caller's tensor); leave the inputs as they are: "
                   f"compute a new tensor (`x = x / ...`) or work on `x.clone()`", FailureKind.IN_PLACE)


def preamble(nn: bool = False, library: bool = False) -> str:
    """The shared imports of graded cells (an exercise's ``PREAMBLE``): ``math``, ``torch`` and
    ``torch.nn.functional as F``; with ``nn``, ``from torch import nn``; with ``library``, the course package as
    ``ac`` (which names a part may use is :mod:`attention_course.grading.library_rules`' business)."""
    text = "import math\n\nimport torch\nimport torch.nn.functional as F\n"
    if nn or library:
        text += "from torch import nn\n"
    if library:
        text += "\nimport attention_course as ac\n"
    return text


def randn(g: torch.Generator, *shape: int, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A case input: standard normal numbers of ``shape`` drawn from ``g``, times ``scale``."""
    return torch.randn(*shape, generator=g, dtype=dtype) * scale


def permutation(g: torch.Generator, n: int, inverse_differs: bool = False, everywhere: bool = False) -> torch.Tensor:
    """A case input: a random permutation of ``n`` items from ``g`` that is not the identity (so reordering is
    really tested); with ``inverse_differs``, not its own inverse either (so p and p⁻¹ cannot be confused); with
    ``everywhere`` (n >= 3), p(i) differs from i and from p⁻¹(i) for every i (no fixed point, no swapped pair),
    so that p and p⁻¹ give different orders on every row, whatever the draw."""
    if everywhere and n < 3:
        raise ValueError(f"a permutation of {n} items always has a fixed point or a swapped pair")
    while True:
        perm = torch.randperm(n, generator=g)
        if everywhere:
            if bool((perm != torch.arange(n)).all()) and bool((perm[perm] != torch.arange(n)).all()):
                return perm
        elif not torch.equal(perm[perm] if inverse_differs else perm, torch.arange(n)):
            return perm


def degenerate(case: Case) -> Case:
    """``case`` marked as degenerate (``credit=False``): its inputs hide what a known mistake of the part gets
    wrong (one key, a single token, no mask, beta = 0, d_k = 1, an empty cache), so that mistake passes it. It
    must still pass for full marks, but earns nothing on its own (issue 43's rule)."""
    return dataclasses.replace(case, credit=False)


def call_function(obj: Callable[..., Any], case: Case) -> Any:
    """The default ``Part.run``: ``obj(*case.args, **case.kwargs)`` on fresh copies of the inputs."""
    args, kwargs = case.fresh_args()
    return obj(*args, **kwargs)


@dataclass(frozen=True)
class Part:
    """One graded part of an exercise: the learner writes ``function`` in a cell tagged ``graded``.

    Attributes:
        name: the part's id: the check method (``check.<name>(...)``), the ``grading.part`` metadata of its
            cells, and its column in the grader's CSV. A Python identifier.
        function: the name of the function (or class) the learner's cell defines (default: ``name``).
        points: marks for the part, earned in proportion to the cases passed (all or nothing when the
            instructor grades with ``--all-or-nothing``).
        summary: one line saying what the function does, shown in progress listings.
        hint: the hints in tiers, ``(concept, approach)``: ``check.hint(name)`` prints the first,
            ``check.hint(name, 2)`` the second. A single string is one tier. No hint contains solution code.
        make_cases: ``generator -> list[Case]``; draw every random number from ``generator``.
        verify: ``(case, output) -> message or None``; ``output`` is in wire form
            (:func:`attention_course.grading.wire.to_wire`): tensors, numbers, strings, lists, tuples, dicts.
        run: ``(learner object, case) -> output``, run in the learner's process (default: call it).
            Whatever ``run`` does, an input the learner's code changed in place (through the copies from
            :meth:`Case.fresh_args`) fails the case with a message naming the argument.
        time_limit: seconds the part's cases may take in the notebook check (default: the checker's).
        all_or_nothing: the part's points only when every case passes, whatever the instructor chose (a bug
            hunt's starting code already passes some cases: only the fix earns marks).
    """

    name: str
    function: str = ""
    points: int = 1
    summary: str = ""
    hint: str | tuple[str, ...] = ""
    make_cases: Callable[[torch.Generator], list[Case]] | None = None
    verify: Callable[[Case, Any], str | None] | None = None
    run: Callable[[Any, Case], Any] = call_function
    time_limit: float | None = None
    all_or_nothing: bool = False

    def __post_init__(self) -> None:
        if not self.function:
            object.__setattr__(self, "function", self.name)
        if self.make_cases is None or self.verify is None:
            raise ValueError(f"part {self.name!r} needs make_cases and verify")
        if not isinstance(self.run, _TrackedRun):
            object.__setattr__(self, "run", _TrackedRun(self.run))
        if not isinstance(self.verify, _CheckedVerify):
            object.__setattr__(self, "verify", _CheckedVerify(self.verify))
        if not self.name.isidentifier():
            raise ValueError(f"part name must be a Python identifier, got {self.name!r}")
        if not self.function.isidentifier():
            raise ValueError(f"function name must be a Python identifier, got {self.function!r}")
        if not isinstance(self.points, int) or self.points < 1:
            raise ValueError(f"points must be a positive int, got {self.points!r}")

    @property
    def hints(self) -> tuple[str, ...]:
        """The hint tiers, first (concept) to last (approach)."""
        tiers = (self.hint,) if isinstance(self.hint, str) else tuple(self.hint)
        return tuple(tier for tier in tiers if tier)


def _snapshot(value: Any, depth: int = 0) -> Any:
    """A copy of what in ``value`` can be changed in place: tensors (cloned), a module's parameters and
    buffers (as a dict of clones), lists, tuples and dicts of these; ``None`` for anything else."""
    if depth > 6:
        return None
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, torch.nn.Module):
        return {name: tensor.detach().clone() for name, tensor in value.state_dict(keep_vars=True).items()}
    if isinstance(value, (list, tuple)):
        return [_snapshot(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {key: _snapshot(item, depth + 1) for key, item in value.items()}
    return None


def _differs(before: Any, value: Any, depth: int = 0) -> bool:
    """Whether ``value`` no longer matches its :func:`_snapshot` ``before`` (changed in place)."""
    if before is None or depth > 6:
        return False
    if isinstance(value, torch.nn.Module):
        now = value.state_dict(keep_vars=True)
        return now.keys() != before.keys() or any(_changed(before[key], now[key]) for key in before)
    if isinstance(before, torch.Tensor):
        return _changed(before, value)
    if isinstance(before, list):
        return (not isinstance(value, (list, tuple)) or len(value) != len(before)
                or any(_differs(b, v, depth + 1) for b, v in zip(before, value)))
    if isinstance(before, dict):
        return (not isinstance(value, dict) or value.keys() != before.keys()
                or any(_differs(before[key], value[key], depth + 1) for key in before))
    return False


def _argument_names(function: Any, args: tuple, kwargs: dict[str, Any]) -> list[str]:
    """The parameter name of each positional argument of a call (``argument N`` where the signature does not
    tell), followed by the keyword arguments' names."""
    try:
        parameters = [p for p in inspect.signature(function).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        parameters = []
    names = [parameters[i].name if i < len(parameters) else f"argument {i + 1}" for i in range(len(args))]
    return names + list(kwargs)


class InputWatch:
    """The one mechanism by which every part's check notices a learner's code that changes its inputs in place.

    :meth:`watch` wraps the learner's function (or, for a class, each module it builds) so that every call
    compares the arguments it was given, before and after: the very tensors the judge passed (a part's ``run``
    may hand over clones it built itself, e.g. ``y.clone()``: it is those clones that are compared), lists,
    tuples and dicts of them, and the parameters and buffers of modules passed in. What changed is named in
    its ``changed`` list. Every :class:`Part`'s ``run`` goes through it (see :class:`_TrackedRun`).
    """

    def __init__(self) -> None:
        self.changed: list[str] = []

    def _call(self, function: Any, call_name: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        values = (*args, *kwargs.values())
        before = [_snapshot(value) for value in values]
        try:
            return function(*args, **kwargs)
        finally:
            # Compared even when the call raised: an edit in place before an error is still an edit.
            names = _argument_names(call_name, args, kwargs)
            for name, old, value in zip(names, before, values):
                if _differs(old, value) and name not in self.changed:
                    self.changed.append(name)

    def watch(self, obj: Any) -> Any:
        """``obj`` as the judge's ``run`` should call it: a function is wrapped; a class that builds
        ``nn.Module`` objects gives modules whose every call is watched; anything else is returned as it is."""
        if inspect.isclass(obj):
            if not issubclass(obj, torch.nn.Module):
                return obj
            return _WatchedClass(self, obj)
        if callable(obj):
            return _WatchedFunction(self, obj)
        return obj


class _WatchedFunction:
    """A learner's function whose calls an :class:`InputWatch` checks (its signature is the function's)."""

    def __init__(self, watch: InputWatch, function: Any) -> None:
        self._watch = watch
        self.__wrapped__ = function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._watch._call(self.__wrapped__, self.__wrapped__, args, kwargs)


class _WatchedClass:
    """A learner's ``nn.Module`` class: the modules it builds have their calls checked by an :class:`InputWatch`
    (through forward hooks, so the module is the learner's own object)."""

    def __init__(self, watch: InputWatch, cls: type) -> None:
        self._watch = watch
        self.__wrapped__ = cls

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self.__wrapped__(*args, **kwargs)
        if isinstance(module, torch.nn.Module):
            pending: list[tuple[list[str], tuple, list[Any]]] = []
            watch = self._watch

            def before(mod: Any, call_args: tuple, call_kwargs: dict[str, Any]) -> None:
                values = (*call_args, *call_kwargs.values())
                names = _argument_names(getattr(mod, "forward", None), call_args, call_kwargs)
                pending.append((names, values, [_snapshot(value) for value in values]))

            def after(mod: Any, call_args: tuple, call_kwargs: dict[str, Any], output: Any) -> None:
                if not pending:
                    return
                names, values, snapshots = pending.pop()
                for name, old, value in zip(names, snapshots, values):
                    if _differs(old, value) and name not in watch.changed:
                        watch.changed.append(name)

            module.register_forward_pre_hook(before, with_kwargs=True)
            module.register_forward_hook(after, with_kwargs=True, always_call=True)
        return module


def unwatched(obj: Any) -> Any:
    """The learner's own object behind :meth:`InputWatch.watch` (for a ``run`` that must call it bare, e.g. to
    measure its memory: the watch's copies would count)."""
    return obj.__wrapped__ if isinstance(obj, (_WatchedFunction, _WatchedClass)) else obj


class _TrackedRun:
    """A part's ``run`` that also reports inputs the learner's code changed in place: the output comes back
    wrapped as ``{INPUTS_CHANGED: [names], "output": output}`` (plain data, so it crosses the wire).

    Two probes, one verdict: an :class:`InputWatch` on every call of the learner's object (whatever tensors
    ``run`` passed), and the copies :meth:`Case.fresh_args` handed out, compared with the case's inputs."""

    def __init__(self, run: Callable[[Any, Case], Any]) -> None:
        self.run = run

    def __call__(self, obj: Any, case: Case) -> Any:
        handed: list[tuple[tuple, dict[str, Any]]] = []
        watch = InputWatch()
        case.__dict__["_handed_out"] = handed
        try:
            output = self.run(watch.watch(obj), case)
        finally:
            case.__dict__.pop("_handed_out", None)
        changed = list(dict.fromkeys([*watch.changed, *case.changed_inputs(handed, obj)]))
        return {INPUTS_CHANGED: changed, "output": output} if changed else output


class _CheckedVerify:
    """A part's ``verify`` that first fails a case whose inputs were changed in place."""

    def __init__(self, verify: Callable[[Case, Any], str | None]) -> None:
        self.verify = verify

    def __call__(self, case: Case, output: Any) -> str | None:
        if isinstance(output, dict) and INPUTS_CHANGED in output:
            names = output[INPUTS_CHANGED]
            if isinstance(names, list) and names and all(isinstance(name, str) for name in names):
                return inputs_changed_message(names)
        return self.verify(case, output)


@dataclass(frozen=True)
class Mistake:
    """A known wrong answer and what to tell the learner who gave it.

    ``variant(*inputs)`` computes the wrong output from the inputs :func:`diagnose` is given (often the case,
    or a few tensors), in the checking process; it may return ``None`` (or raise) when the mistake cannot
    be told apart on these inputs. ``message`` is the text, or ``message(*inputs)`` builds it. Use tables of
    these instead of chains of ``if``::

        MISTAKES = (Mistake(lambda s: torch.softmax(s, dim=-2), "your softmax runs over the queries"),)
        diagnose(MISTAKES, output, scores)
    """

    variant: Callable[..., Any]
    message: str | Callable[..., str]
    on: str = ""  # in a declared check (declare.Check): the output the variant computes (default: the first)


def diagnose(mistakes: Sequence[Mistake], output: Any, *inputs: Any,
             matches: Callable[[Any, Any], bool] | None = None, right: Any = None) -> str | None:
    """The message of the first mistake whose variant ``output`` matches (``None`` when none does). With
    ``right`` (the expected output), a variant that the right answer matches too is passed over: on these
    inputs that mistake cannot be told apart, and naming it would blame a learner for it wrongly."""
    from attention_course.grading.compare import matches as default_matches

    same = matches or default_matches
    for mistake in mistakes:
        try:
            wrong = mistake.variant(*inputs)
            if wrong is None or not same(output, wrong) or (right is not None and same(right, wrong)):
                continue
        except Exception:  # a variant that does not apply to these inputs
            continue
        message = mistake.message(*inputs) if callable(mistake.message) else mistake.message
        return Finding(message, FailureKind.KNOWN_MISTAKE)
    return None


def pair_problem(output: Any, out_shape: Sequence[int], weights_shape: Sequence[int],
                 names: tuple[str, str] = ("output", "weights")) -> str | None:
    """``output`` must be a pair ``(output, weights)`` of floating-point tensors of these shapes: the check
    that every attention function returning both runs first (``None`` when it holds, else the message)."""
    from attention_course.grading.compare import first_problem, tensor_problem, tuple_problem

    return first_problem(
        lambda: tuple_problem(output, *names),
        lambda: tensor_problem(output[0], f"your {names[0]}", out_shape),
        lambda: tensor_problem(output[1], f"your {names[1]}", weights_shape),
    )


@dataclass(frozen=True)
class Exercise:
    """A graded exercise notebook: its id, title, trusted preamble and parts.

    Attributes:
        id: the exercise id used in ``exercise("ex02")`` and in the notebook's metadata
            (``metadata.grading.exercise``).
        preamble: Python source the grader runs before the learner's graded cells: the imports the graded
            code may rely on. The notebook's cell tagged ``preamble`` must hold exactly this source (a test
            checks it), so the notebook and the grader agree; the grader never runs the learner's copy.
        parts: the graded parts, in notebook order.
        chapters: the chapters (notebook stems in ``chapters/``) whose ideas the exercise practises.
        allowed: part -> the course-library names that part may use (the library rule,
            :mod:`attention_course.grading.library_rules`); a part not listed may use none.
        title: the notebook's title (read with the parts' texts by :func:`with_texts`).
    """

    id: str
    preamble: str
    parts: tuple[Part, ...]
    chapters: tuple[str, ...] = ()
    allowed: Mapping[str, frozenset[str]] = field(default_factory=dict)
    title: str = ""

    def __post_init__(self) -> None:
        names = [part.name for part in self.parts]
        if len(set(names)) != len(names):
            raise ValueError(f"exercise {self.id!r} has duplicate part names: {names}")
        functions = [part.function for part in self.parts]
        if len(set(functions)) != len(functions):
            raise ValueError(f"exercise {self.id!r} has parts sharing a function name: {functions}")
        if set(self.allowed) - set(names):
            raise ValueError(f"exercise {self.id!r} allows library names to unknown parts {sorted(self.allowed)}")

    @property
    def max_score(self) -> int:
        return sum(part.points for part in self.parts)

    def part(self, name: str) -> Part:
        """The part called ``name``; ``KeyError`` naming the known parts otherwise."""
        for part in self.parts:
            if part.name == name:
                return part
        raise KeyError(f"exercise {self.id!r} has no part {name!r}; its parts are {[p.name for p in self.parts]}")


def call_expecting_error(obj: Any, case: Case) -> Any:
    """Call the learner's object; for a case that demands an error (``"error"`` in ``case.data``), report what
    it raised or returned as plain data, judged by :func:`~attention_course.grading.compare.value_error_problem`.
    Other cases are called as usual."""
    if "error" not in case.data:
        return call_function(obj, case)
    args, kwargs = case.fresh_args()
    try:
        returned = obj(*args, **kwargs)
    except NotImplementedError:
        raise
    except Exception as exc:  # what was raised is the answer here; verify gives the verdict
        return {"raised": type(exc).__name__, "message": str(exc)}
    return {"returned": returned}


#: The hint tiers of a part in an exercise's text file, first to last.
HINT_TIERS = ("concept", "approach")
_PART_KEYS = frozenset({"summary", *HINT_TIERS})


def _read_toml(path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10 (a dependency there)
        import tomli as tomllib
    with path.open("rb") as file:
        return tomllib.load(file)


def _prose(text: Any, where: str) -> str:
    """A text from the file as one paragraph: line breaks inside it are only the file's wrapping."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where} must be a non-empty string")
    return " ".join(text.split())


def with_texts(exercise: Exercise, path: Path | None = None) -> Exercise:
    """``exercise`` with what learners read taken from ``exercises/<id>.toml`` beside its module: the
    title, and for every part its ``summary`` and its hint tiers ``concept`` (``check.hint(part)``) and
    ``approach`` (``check.hint(part, 2)``). Instructors edit the wording there without touching a check.

    Raises:
        ValueError: the file is missing, names a part the exercise lacks or a key it does not know, or
            leaves a part without its summary or a hint tier.
    """
    path = path or Path(__file__).parent / "exercises" / f"{exercise.id}.toml"
    if not path.is_file():
        raise ValueError(f"exercise {exercise.id!r} has no text file {path.name} beside its module")
    data = _read_toml(path)
    where = path.name
    unknown = set(data) - {"title", "parts"}
    if unknown:
        raise ValueError(f"{where}: unknown top-level keys {sorted(unknown)}; expected 'title' and [parts.<name>]")
    texts = data.get("parts", {})
    names = [part.name for part in exercise.parts]
    extra = set(texts) - set(names)
    if extra:
        raise ValueError(f"{where}: no parts {sorted(extra)} in exercise {exercise.id!r} (its parts: {names})")
    parts = []
    for part in exercise.parts:
        text = texts.get(part.name)
        if not isinstance(text, dict):
            raise ValueError(f"{where}: part {part.name!r} has no [parts.{part.name}] table")
        if set(text) != _PART_KEYS:
            raise ValueError(f"{where}: [parts.{part.name}] must hold exactly {sorted(_PART_KEYS)}, "
                             f"got {sorted(text)}")
        hints = tuple(_prose(text[tier], f"{where}: {part.name}.{tier}") for tier in HINT_TIERS)
        parts.append(dataclasses.replace(part, summary=_prose(text["summary"], f"{where}: {part.name}.summary"),
                                         hint=hints))
    return dataclasses.replace(exercise, title=_prose(data.get("title"), f"{where}: title"), parts=tuple(parts))
