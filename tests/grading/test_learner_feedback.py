"""What learners are told: inputs changed in place, hints that teach without the solution's code, feedback
files, check cells and helpers from other cells, and the class summary (issue 24, item 2)."""

from __future__ import annotations

import ast
import functools
import html
import inspect
import re
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import torch

from attention_course.grading import get_exercise
from attention_course.grading.checker import Checker
from attention_course.grading.evaluate import (
    CARRIED_MARK,
    CHECK_CELL_EDITED,
    assemble,
    carried_definitions,
    carried_note,
    check_cell_ok,
    outside_names,
    with_carried,
)
from attention_course.grading.grader import NotebookResult, grade_notebook
from attention_course.grading.isolation import Limits
from attention_course.grading.judge import FAILED, CaseVerdict, PartVerdict, shape_words
from attention_course.grading.launcher import SandboxPool
from attention_course.grading.notebook_format import (
    BEGIN_SOLUTION,
    BUGGY,
    END_SOLUTION,
    TAG_CHECK,
    TAG_GRADED,
    cell_part,
    cell_tags,
    notebook_exercise,
)
from attention_course.grading.report import Roster, class_summary, common_failures, feedback_html, feedback_markdown
from attention_course.grading.spec import InputWatch, _TrackedRun
from tests.grading.mutants import IN_PROCESS, MUTANTS, apply
from tests.grading.test_checks import SOLUTIONS, namespace_of, run_check
from tests.grading.test_verdicts import _namespace, judge_in_process

ROOT = Path(__file__).resolve().parents[2]


# --- a. inputs changed in place: one mechanism, every part ------------------------------------------------
def _edit_in_place(value, depth: int = 0) -> bool:
    """Change the first tensor (or module parameter) found in ``value`` in place; whether one was changed."""
    if depth > 4:
        return False
    with torch.no_grad():
        if isinstance(value, torch.Tensor) and value.numel() > 0:
            try:
                if value.dtype == torch.bool:
                    value.logical_not_()
                else:
                    value.add_(1)
                return True
            except RuntimeError:  # an expanded view cannot be written to: try the next input
                return False
        if isinstance(value, torch.nn.Module):
            return any(_edit_in_place(p, depth + 1) for p in list(value.parameters())[:1])
        if isinstance(value, (list, tuple)):
            return any(_edit_in_place(item, depth + 1) for item in value)
        if isinstance(value, dict):
            return any(_edit_in_place(item, depth + 1) for item in value.values())
    return False


def _editing(obj, edits: list[int]):
    """The solution ``obj``, but changing its first editable input in place after computing its answer."""
    if inspect.isclass(obj):
        class Editing(obj):
            def forward(self, *args, **kwargs):
                output = super().forward(*args, **kwargs)
                edits.append(_edit_in_place((*args, *kwargs.values())))
                return output
        return Editing

    @functools.wraps(obj)
    def editing(*args, **kwargs):
        output = obj(*args, **kwargs)
        edits.append(_edit_in_place((*args, *kwargs.values())))
        return output
    return editing


def _has_editable_input(value, depth: int = 0) -> bool:
    if isinstance(value, (torch.Tensor, torch.nn.Module)):
        return True
    if depth < 4 and isinstance(value, (list, tuple)):
        return any(_has_editable_input(item, depth + 1) for item in value)
    if depth < 4 and isinstance(value, dict):
        return any(_has_editable_input(item, depth + 1) for item in value.values())
    return False


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.name for p in SOLUTIONS])
def test_every_part_fails_a_solution_that_changes_its_input_in_place(path):
    ex, namespace = namespace_of(path)
    for part in ex.parts:
        assert isinstance(part.run, _TrackedRun), f"{ex.id}.{part.name} bypasses the input watch"
        edits: list[bool] = []
        checker = Checker(ex, seed=0, isolated=False)
        text = " ".join(run_check(checker, part.name, _editing(namespace[part.function], edits)).split())
        if any(edits):
            assert not checker.passed(part.name), f"{ex.id}.{part.name} passes a function that edits its input"
            assert "changed its input `" in text and "in place" in text, f"{ex.id}.{part.name}: {text}"
        else:  # nothing to edit: no case hands the function a tensor or a module
            cases = part.make_cases(torch.Generator().manual_seed(0))
            assert not any(_has_editable_input((c.args, c.kwargs)) for c in cases), f"{ex.id}.{part.name}: {text}"


def test_the_watch_compares_the_tensors_passed_not_copies_of_them():
    watch = InputWatch()

    def residual(x, y):
        y += x  # the caller's tensor changes
        return y

    watched = watch.watch(residual)
    given = torch.ones(3)
    watched(torch.ones(3), given)
    assert watch.changed == ["y"] and torch.equal(given, torch.full((3,), 2.0))
    clean = InputWatch()
    clean.watch(lambda x, y: x + y)(torch.ones(3), torch.ones(3))
    assert clean.changed == []


def test_ex10_decoder_layer_with_in_place_residual_loses_its_points():
    path = ROOT / "exercises" / "solutions" / "ex10_decoder_and_transformer.ipynb"
    ex, namespace = namespace_of(path)
    cell = next(c for c in nbformat.read(path, as_version=4).cells
                if TAG_GRADED in cell_tags(c) and cell_part(c) == "decoder_layer_forward")
    assert "y = y + " in cell.source
    scope = dict(namespace)
    exec(cell.source.replace("y = y + ", "y += "), scope)  # the learner's `y += ...` on the caller's y
    checker = Checker(ex, seed=0, isolated=False)
    text = " ".join(run_check(checker, "decoder_layer_forward", scope["decoder_layer_forward"]).split())
    assert not checker.passed("decoder_layer_forward")
    assert "your function changed its input `y` in place" in text
    assert checker._verdicts["decoder_layer_forward"].score < ex.part("decoder_layer_forward").points


# --- b. hints without any expression of the solution -------------------------------------------------------
# Hint text and solution code are compared as tokens: Python's identifiers, numbers and operators, with
# whitespace, quotes and backticks dropped (so `dim = -1` and "dim=-1" are the same four tokens). A hint fails
# when it shares a run of at least RUN_TOKENS consecutive tokens with the solution code of its exercise and the
# run holds a call or an index (a name, `)` or `]` followed by `(` or `[`). Why 6: the shortest give-away the
# issue lists, `tokens[:, 1:]`, is 7 tokens, and a method call with two arguments, `.transpose(1, 2)`, is 6;
# while 5 tokens leave prose room to name a function or a keyword (`F.cross_entropy`, `dim=-1)`, `sqrt(d_k)`),
# which teaches what to look up without writing the line.
RUN_TOKENS = 6
_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+|\*\*|//|->|==|!=|<=|>=|<<|>>"
                    r"|[-+*/%@&|^~<>]=?|[()\[\]{},:.;=]")


def code_tokens(text: str) -> list[str]:
    """``text`` (code or prose) as normalised Python tokens."""
    return _TOKEN.findall(text.translate(str.maketrans({"'": " ", '"': " ", "`": " "})))


def solution_code(path: Path) -> str:
    """The solution blocks of every graded cell of a solution notebook, comments dropped."""
    lines: list[str] = []
    for cell in nbformat.read(path, as_version=4).cells:
        if TAG_GRADED not in cell_tags(cell):
            continue
        inside = False
        for line in cell.source.splitlines():
            if line.strip() == BEGIN_SOLUTION:
                inside = True
            elif line.strip() in (END_SOLUTION, BUGGY):
                inside = False
            elif inside:
                lines.append(line.split("#")[0])
    return "\n".join(lines)


def shared_expressions(hint: str, solution: str, length: int = RUN_TOKENS) -> list[str]:
    """The runs of at least ``length`` tokens that ``hint`` shares with ``solution`` and that hold a call or an
    index, each as the longest such run from where it starts."""
    said, code = code_tokens(hint), code_tokens(solution)
    starts: dict[tuple[str, ...], list[int]] = {}
    for j in range(len(code) - length + 1):
        starts.setdefault(tuple(code[j:j + length]), []).append(j)
    found, i = [], 0
    while i <= len(said) - length:
        if tuple(said[i:i + length]) not in starts:
            i += 1
            continue
        longest = length
        for j in starts[tuple(said[i:i + length])]:
            k = length
            while i + k < len(said) and j + k < len(code) and said[i + k] == code[j + k]:
                k += 1
            longest = max(longest, k)
        run = said[i:i + longest]
        if any((a[0].isalpha() or a[0] == "_" or a in ")]") and b in "([" for a, b in zip(run, run[1:])):
            found.append(" ".join(run))
        i += longest
    return found


NOTEBOOK_OF = {notebook_exercise(nbformat.read(path, as_version=4)): path for path in SOLUTIONS}


@pytest.mark.parametrize("exercise_id", sorted(NOTEBOOK_OF))
def test_no_hint_holds_an_expression_of_the_solution(exercise_id):
    solution = solution_code(NOTEBOOK_OF[exercise_id])
    assert len(code_tokens(solution)) > 50
    for part in get_exercise(exercise_id).parts:
        for level, hint in enumerate(part.hints, start=1):
            shared = shared_expressions(hint, solution)
            assert not shared, f"{exercise_id}.{part.name} hint {level} writes the solution's code: {shared}"


# The level-2 hints the issue found giving the solution away, word for word.
GIVEN_AWAY = [
    ("ex13", "torch.topk(logits, k, dim=-1).values[..., -1:] is each row's k-th largest value; every logit below "
             "it is dropped (masked_fill with -inf)."),
    ("ex13", "The predictions are logits[:, :-1], the targets tokens[:, 1:]. Flatten both and use F.cross_entropy."),
    ("ex05", "Fill the blocked scores (where the mask is False: scores.masked_fill(~mask, value)) with "
             "torch.finfo(scores.dtype).min rather than -inf, then zero the rows with no allowed key: "
             "mask.any(dim=-1, keepdim=True) is False exactly there."),
    ("ex05", "Write a helper causal_mask(L) = torch.ones(L, L, dtype=torch.bool).tril()."),
]


@pytest.mark.parametrize(("exercise_id", "hint"), GIVEN_AWAY)
def test_the_hints_that_gave_the_solution_away_are_caught(exercise_id, hint):
    shared = shared_expressions(hint, solution_code(NOTEBOOK_OF[exercise_id]))
    assert shared and all(len(run.split()) >= RUN_TOKENS for run in shared), shared
    # Naming what to use, without writing the line, passes.
    assert not shared_expressions("use F.cross_entropy with ignore_index; dim=-1, sqrt(d_k), torch.topk",
                                  solution_code(NOTEBOOK_OF[exercise_id]))


# The failure messages are feedback too: a wrong answer must not be answered with the line that fixes it. Every
# string an exercise's check module can show (its message texts, reference descriptions and case names; f-strings
# with each placeholder as a value no code holds; docstrings excepted) and each part's summary obey the hints'
# rule, except for an expression that the learner's own notebook already states (the task's specification).
CHECK_MODULES = Path(inspect.getsourcefile(get_exercise("ex02").parts[0].make_cases)).parent
_PLACEHOLDER = "FORMATTED_VALUE"


def module_texts(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of each string literal of a module that is not a docstring; an f-string's placeholders
    read as ``FORMATTED_VALUE``."""
    tree = ast.parse(source)
    skipped: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            skipped.add(id(body[0].value))
        if isinstance(node, ast.JoinedStr):  # its pieces are read as one text below
            skipped.update(id(inner) for value in node.values for inner in ast.walk(value))
    texts = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            texts.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr):
            texts.append((node.lineno, "".join(value.value if isinstance(value, ast.Constant) else
                                               f" {_PLACEHOLDER} " for value in node.values)))
    return texts


def stated_to_the_learner(exercise_id: str) -> str:
    """Every cell of the learner's notebook (markdown and starter code) as normalised tokens, space-delimited."""
    notebook = nbformat.read(SOLUTIONS[0].parent.parent / NOTEBOOK_OF[exercise_id].name, as_version=4)
    return f" {' '.join(code_tokens(' '.join(cell.source for cell in notebook.cells)))} "


def given_away(text: str, solution: str, stated: str) -> list[str]:
    return [run for run in shared_expressions(text, solution) if f" {run} " not in stated]


def check_texts_of(exercise_id: str) -> dict[str, list[tuple[int, str]]]:
    """The texts of the exercise's check module (see :func:`module_texts`), and those of the code it imports from
    another exercise's module (the bug hunt's dropout is ex08's): the imported definitions and the module's
    top-level definitions they use, whose messages reach this exercise's learners too. File -> texts."""
    package, own = "attention_course.grading.exercises.", (CHECK_MODULES / f"{exercise_id}.py").read_text()
    found = {f"{exercise_id}.py": module_texts(own)}
    for node in ast.walk(ast.parse(own)):
        if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package)):
            continue
        module = node.module.removeprefix(package)
        source = (CHECK_MODULES / f"{module}.py").read_text()
        defined: dict[str, ast.stmt] = {}
        for statement in ast.parse(source).body:
            if isinstance(statement, (ast.FunctionDef, ast.ClassDef)):
                defined[statement.name] = statement
            elif isinstance(statement, ast.Assign):
                defined.update({target.id: statement for target in statement.targets if isinstance(target, ast.Name)})
        wanted, used = [alias.name for alias in node.names], set()
        while wanted:
            name = wanted.pop()
            if name in defined and name not in used:
                used.add(name)
                wanted += [n.id for n in ast.walk(defined[name]) if isinstance(n, ast.Name)]
        lines = {line for name in used for line in range(defined[name].lineno, defined[name].end_lineno + 1)}
        found[f"{module}.py ({', '.join(sorted(used))})"] = [(line, text) for line, text in module_texts(source)
                                                              if line in lines]
    return found


@pytest.mark.parametrize("exercise_id", sorted(NOTEBOOK_OF))
def test_no_check_message_writes_an_expression_of_the_solution(exercise_id):
    solution, stated = solution_code(NOTEBOOK_OF[exercise_id]), stated_to_the_learner(exercise_id)
    assert len(stated) > 1000
    for where, texts in check_texts_of(exercise_id).items():
        assert len(texts) > 3
        for line, text in texts:
            assert not given_away(text, solution, stated), f"{where} line {line} writes the solution's code: {text!r}"
    for part in get_exercise(exercise_id).parts:
        assert not given_away(part.summary, solution, stated), f"{exercise_id}.{part.name}'s summary: {part.summary!r}"


def test_a_message_that_gave_the_solution_away_is_caught():
    solution, stated = solution_code(NOTEBOOK_OF["ex10"]), stated_to_the_learner("ex10")
    module = ('''"""A docstring may quote tgt[:, 1:]."""\n'''
              '''RULE = "position t must predict token t + 1, tgt[:, 1:]"\n'''
              '''def f(name):\n    return f"{name} is wrong: tgt[:, :-1] is the decoder's input"\n'''
              '''FINE = f"{name}[:, 1:] is computed, not written"\n''')
    texts = module_texts(module)
    assert [line for line, text in texts if given_away(text, solution, stated)] == [2, 4]
    assert all("docstring" not in text for _, text in texts)
    # Code one exercise imports from another is read too, and only that code: the bug hunt's dropout from ex08.
    imported = [where for where in check_texts_of("bug_hunt") if where != "bug_hunt.py"]
    assert imported == ["ex08.py (RANDOMNESS_Z, _called_twice, _drop_tolerance, _random_dropout_problem, "
                        "_randomness_problem, dropout_randomness, run_dropout, verify_dropout)"]
    assert list(check_texts_of("ex10")) == ["ex10.py"]
    # An expression the learner's notebook states is the task, not a give-away: ex08's pre-norm formula.
    ex08 = solution_code(NOTEBOOK_OF["ex08"])
    assert shared_expressions("pre-norm is x + sublayer(norm(x))", ex08)
    assert not given_away("pre-norm is x + sublayer(norm(x))", ex08, stated_to_the_learner("ex08"))


# --- c. feedback files: the first hint by default, none for a part lost to its check cell -----------------
def _result(parts: list[PartVerdict], path: str = "ada@uni.edu/ex05.ipynb") -> NotebookResult:
    return NotebookResult(path, "ex05", sum(v.score for v in parts), sum(v.max_score for v in parts), parts)


def _failed(part: str, *messages: str, passed: int = 0, points: int = 2) -> PartVerdict:
    cases = tuple(CaseVerdict(f"case {i}", message) for i, message in enumerate(messages))
    cases += tuple(CaseVerdict(f"passing case {i}", None) for i in range(passed))
    return PartVerdict(part, points, FAILED, f"failed {len(messages)} cases; first: {messages[0]}", cases)


def test_feedback_gives_the_concept_hint_and_the_approach_only_when_asked():
    ex = get_exercise("ex05")
    part = ex.part("masked_softmax")
    result = _result([_failed("masked_softmax", "row 1 of your weights sums to 0.5")])
    default = feedback_markdown(result)
    assert part.hints[0] in default and "Hint (concept):" in default
    assert part.hints[1] not in default and "Hint 2" not in default
    asked = feedback_markdown(result, hint_levels=2)
    assert part.hints[0] in asked and part.hints[1] in asked and "Hint 2 (approach):" in asked
    assert part.hints[1] not in feedback_html(result) and part.hints[1] in html.unescape(feedback_html(result,
                                                                                                      hint_levels=2))


def test_feedback_gives_no_hint_for_a_part_lost_to_an_edited_check_cell():
    ex = get_exercise("ex05")
    lost = PartVerdict("masked_softmax", 2, FAILED, f"{CHECK_CELL_EDITED}; restore the cell "
                                                    "`check.masked_softmax(masked_softmax)` to earn this part's marks")
    text = feedback_markdown(_result([lost, _failed("scaled_scores", "your scores are off by a factor 2")]),
                             hint_levels=2)
    section = text.split("## masked_softmax")[1].split("## ")[0]
    assert "restore the cell" in section
    assert "Hint" not in section and ex.part("masked_softmax").hints[0] not in text
    assert ex.part("scaled_scores").hints[0] in text  # the other failed part keeps its hints


def test_the_edited_check_cell_verdict_starts_with_the_marker():
    ex = get_exercise("ex05")
    result = SimpleNamespace(cell_errors={}, failures={}, outcomes={})
    verdicts = assemble(ex, {"scaled_scores": "def scaled_scores(Q, K): pass"}, {"scaled_scores": []}, result,
                        check_cells={"scaled_scores": False})
    assert verdicts[0].message.startswith(CHECK_CELL_EDITED)


# --- f. the instructor's summary: missing learners, the most common failure reasons -----------------------
def test_summary_lists_the_roster_members_without_a_notebook():
    roster = Roster([{"email": "ada@uni.edu", "learner_id": "s001", "name": "Ada L."},
                     {"email": "bob@uni.edu", "learner_id": "s002", "name": "Bob M."},
                     {"file": "ex05_carol.ipynb", "learner_id": "s003", "name": ""}])
    results = [_result([_failed("scaled_scores", "off by 2")], path="/class/ada@uni.edu/ex05.ipynb")]
    assert roster.missing([r.path for r in results]) == [("s002", "Bob M."), ("s003", "")]
    summary = class_summary(results, roster=roster)
    assert "Missing: 2 of the roster's 3 learners sent no notebook" in summary
    assert "- s002 (Bob M.)" in summary and "- s003\n" in summary and "s001" not in summary
    everyone = [_result([], path=p) for p in ("/c/ada@uni.edu/x.ipynb", "/c/bob@uni.edu/x.ipynb",
                                              "/c/ex05_carol.ipynb")]
    assert "Missing: 0 of the roster's 3" in class_summary(everyone, roster=roster)


def test_summary_gives_the_three_most_common_failure_reasons_of_each_part():
    said = {"inverted": "your mask is inverted: True must mean 'may attend'",
            "sums": "row {} of your weights sums to {}",
            "nan": "your output has NaN in row {}",
            "shape": "expected shape (2, 3), got (3, 2)"}
    verdicts = ([_failed("masked_softmax", said["sums"].format(i, 0.5 + i)) for i in range(4)]
                + [_failed("masked_softmax", said["inverted"]) for _ in range(3)]
                + [_failed("masked_softmax", said["nan"].format(i)) for i in range(2)]
                + [_failed("masked_softmax", said["shape"])])
    ranked = common_failures(verdicts)
    assert [count for count, _ in ranked] == [4, 3, 2]
    assert ranked[0][1] == said["sums"].format(0, 0.5) and ranked[1][1] == said["inverted"]
    passing = PartVerdict("masked_softmax", 2, "passed", "all 3 cases passed")
    results = [_result([v, PartVerdict("scaled_scores", 1, "passed", "all")], path=f"/c/{i}.ipynb")
               for i, v in enumerate([*verdicts, passing])]
    summary = class_summary(results)
    block = summary.split("Most common reasons")[1]
    assert "- masked_softmax:\n  1. (4) row 0 of your weights sums to 0.5\n  2. (3) your mask is inverted" in block
    assert "3. (2) your output has NaN in row 0" in block and "expected shape" not in block
    assert "- scaled_scores: no failures." in block


# --- d. check cells with extra lines; helpers and imports from other cells -----------------------------------
@pytest.mark.parametrize(("source", "ok"), [
    ("check.masked_softmax(masked_softmax)", True),
    ("# my check\ncheck.masked_softmax(masked_softmax, hint=True)\n", True),
    ("print(masked_softmax(torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool)))\n"
     "check.masked_softmax(masked_softmax)\nimport time\nstart = time.time()", True),
    ("%time x = 1\ncheck.masked_softmax(masked_softmax)", True),
    ("", False),
    ("check.masked_softmax(lambda s, m: torch.softmax(s, -1))", False),  # not the learner's function
    ("masked_softmax = torch.softmax\ncheck.masked_softmax(masked_softmax)", False),  # rebinds it first
    ("def masked_softmax(s, m):\n    return s\ncheck.masked_softmax(masked_softmax)", False),
    ("from torch import softmax as scaled_scores\ncheck.masked_softmax(masked_softmax)", False),  # another part's
    ("check = exercise('ex05')\ncheck.masked_softmax(masked_softmax)", False),
    ("check.masked_softmax(masked_softmax)\ncheck.masked_softmax(masked_softmax)", False),
    ("check.masked_softmax(masked_softmax)\ncheck._verdicts.clear()", False),
    ("if True:\n    check.masked_softmax(masked_softmax)", False),
    ("check.masked_softmax(masked_softmax, hint='yes')", False),
])
def test_a_check_cell_may_hold_other_lines_that_leave_the_check_alone(source, ok):
    functions = [part.function for part in get_exercise("ex05").parts]
    assert check_cell_ok(source, "masked_softmax", "masked_softmax", functions) is ok


def test_plain_helpers_and_imports_of_other_cells_are_carried_and_nothing_else():
    graded = {"a": "def a(x):\n    return helper(x) + np.pi + THRESHOLD\n", "b": "def b(x):\n    return x\n"}
    others = ["import numpy as np, os\nTHRESHOLD = 3\n",
              "def helper(x):\n    return inner(x)\n\ndef inner(x):\n    return x * 2\n",
              "def helper(x):  # the later definition wins, as in a kernel run top to bottom\n    return inner(x)\n",
              "@staticmethod\ndef decorated(x):\n    return x\nclass Thing:\n    pass\n",
              "def b(x):\n    return 0\ndef check(*a):\n    pass\n"]
    carried = carried_definitions(graded, others, "import torch\n", ["a", "b"])
    assert set(carried) == {"a"}
    code, names = carried["a"]
    assert names == ["np", "helper", "inner"]
    assert "import numpy as np" in code and "os" not in code and "THRESHOLD" not in code
    assert "def helper" in code and "def inner" in code and "return 0" not in code
    scope: dict = {}
    exec(with_carried(graded["a"], carried["a"]), scope)
    assert callable(scope["a"]) and callable(scope["helper"]) and callable(scope["inner"])
    assert "THRESHOLD" in outside_names([with_carried(graded["a"], carried["a"])], "import torch\n")
    assert CARRIED_MARK in with_carried(graded["a"], carried["a"])
    assert "`np`, `helper`, `inner` from your other cells" in carried_note(carried)
    # A name that the graded cells or the preamble define is never carried (the graded cell's wins).
    assert carried_definitions({"a": "import numpy as np\ndef a(x):\n    return helper(x)\n"},
                               ["import math as np\ndef helper(x):\n    return x\n"], "", ["a"])["a"][1] == ["helper"]


def _ex05_notebook(folder: Path, edit) -> Path:
    path = ROOT / "exercises" / "solutions" / "ex05_scaling_and_masking.ipynb"
    nb = nbformat.read(path, as_version=4)
    edit(nb)
    out = folder / "ex05_scaling_and_masking.ipynb"
    nbformat.write(nb, out)
    return out


def _cell(nb, tag: str, part: str):
    return next(c for c in nb.cells if tag in cell_tags(c) and cell_part(c) == part)


def test_the_grader_carries_helpers_keeps_the_rules_and_accepts_a_chatty_check_cell(tmp_path):
    def edit(nb):
        masked = _cell(nb, TAG_GRADED, "masked_softmax")
        index = nb.cells.index(masked)
        # The learner moved the whole function body into a helper in a scratch cell, with an import.
        body = masked.source.split("### BEGIN SOLUTION\n")[1].split("    ### END SOLUTION")[0]
        masked.source = ("def masked_softmax(scores, mask):\n    return softmax_helper(scores, mask)\n")
        nb.cells.insert(index, nbformat.v4.new_code_cell(
            "import numpy as np\nimport torch\n\ndef softmax_helper(scores, mask):\n"
            f"    assert np.isfinite(1.0)\n{body}"))
        # A debug line in a check cell that still calls the check.
        check = _cell(nb, TAG_CHECK, "masked_softmax")
        check.source = "print('about to check')\n" + check.source
        # A helper in another cell that reaches for the course library: carried, then refused by the rule.
        scores = _cell(nb, TAG_GRADED, "scaled_scores")
        scores.source = "def scaled_scores(Q, K):\n    return borrowed(Q, K)\n"
        nb.cells.insert(nb.cells.index(scores), nbformat.v4.new_code_cell(
            "import attention_course as ac\n\ndef borrowed(Q, K):\n"
            "    return ac.scaled_dot_product_attention(Q, K, K)[1]\n"))

    result = grade_notebook(_ex05_notebook(tmp_path, edit), timeout=30, seed=3, isolation="auto")
    verdicts = {v.part: v for v in result.parts}
    assert verdicts["masked_softmax"].passed, verdicts["masked_softmax"].message
    assert verdicts["scaled_scores"].score == 0 and "no marks" in verdicts["scaled_scores"].message
    assert "ac.scaled_dot_product_attention" in verdicts["scaled_scores"].message
    assert "`softmax_helper`" in result.message and "carried into the graded run" in result.message
    assert "`np`" in result.message


# --- e. messages that say what is wrong --------------------------------------------------------------------
def _ex13_with(part: str, old: str, new: str):
    path = ROOT / "exercises" / "solutions" / "ex13_decoder_only_language_models.ipynb"
    ex, namespace = namespace_of(path)
    cell = next(c for c in nbformat.read(path, as_version=4).cells
                if TAG_GRADED in cell_tags(c) and cell_part(c) == part)
    assert cell.source.count(old) == 1
    scope = dict(namespace)
    exec(cell.source.replace(old, new), scope)
    checker = Checker(ex, seed=0, isolated=False)
    return checker, " ".join(run_check(checker, part, scope[ex.part(part).function]).split())


def test_a_sampler_that_never_applies_top_p_is_told_so():
    checker, text = _ex13_with("sample_next_token", "filtered = top_p_filter(filtered, top_p)", "pass")
    assert not checker.passed("sample_next_token")
    assert "which top-p = 0.6 removes" in text and "without the top-p filter" in text
    assert "do not filter after drawing" not in text
    checker, text = _ex13_with("sample_next_token", "filtered = top_k_filter(filtered, top_k)", "pass")
    assert "which top-k = 2 removes" in text and "without the top-k filter" in text


def test_sampler_mistakes_of_issue_43_are_named():
    """Top-p skipped when top-k is given, filters applied before the temperature, and a top-p that keeps one token
    (told to check its filters, not to use its generator)."""
    checker, text = _ex13_with("sample_next_token", "    if top_p is not None:\n        filtered = top_p_filter",
                               "    elif top_p is not None:\n        filtered = top_p_filter")
    assert checker._verdicts["sample_next_token"].score < 2
    assert "your draws ignore top_p = 0.6 when top_k = 4 is given too" in text
    early = next(m for m in MUTANTS if m.name == "sample_filters_before_temperature")
    checker, text = _ex13_with("sample_next_token", early.old, early.new)
    assert "your draws follow the filters applied to the untempered logits, then the temperature" in text
    checker, text = _ex13_with("sample_next_token", "filtered = top_p_filter(filtered, top_p)",
                               "filtered = top_k_filter(filtered, 1)")  # a top-p that keeps one token
    assert "every draw gave token" in text and "your sampler keeps one token, but with top-p = 0.6" in text
    assert "generator" not in text.split("top-p 0.6 on probabilities")[1].split("FAIL")[0].split("PASS")[0]


def test_a_cache_joined_along_the_wrong_dimension_is_explained_with_its_shapes():
    checker, text = _ex13_with("cached_attention_step", "torch.cat([past_keys, k], dim=1)",
                               "torch.cat([past_keys, k], dim=0)")
    assert not checker.passed("cached_attention_step")
    assert "shapes do not fit: you joined tensors (torch.cat or torch.stack) along dimension 0" in text
    assert "one has size 4 where another has size 1" in text
    assert "This case gives your function tensors of shapes (2, 1, 8), (8, 8), (8, 8), (8, 8), (2, 4, 8)" in text


@pytest.mark.parametrize(("make", "words"), [
    (lambda: torch.zeros(6, 8) @ torch.zeros(4, 8), "a (6, 8) matrix by a (4, 8) matrix"),
    (lambda: torch.zeros(2, 6, 8) @ torch.zeros(2, 4, 8), "must be (2, 8), yours are (2, 4)"),
    (lambda: torch.zeros(2, 3) + torch.zeros(2, 4), "has sizes 3 and 4"),
    (lambda: torch.zeros(7).view(2, 3), "7 numbers into the shape (2, 3)"),
    (lambda: torch.zeros(2, 1, 8).expand(3, 1, 8), "a tensor of shape (2, 1, 8) to (3, 1, 8)"),
])
def test_pytorch_shape_errors_read_in_plain_words(make, words):
    with pytest.raises(RuntimeError) as error:
        make()
    assert words in shape_words(str(error.value))
    assert shape_words("CUDA out of memory") is None


# --- g. the notebook check's workers: started ahead of need, forked from one zygote per kernel --------------------
def test_a_pool_taken_without_refill_starts_the_replacement_only_when_asked(monkeypatch):
    started: list[object] = []

    class Fake:
        def poll(self):
            return None

        def kill(self):
            pass

    def start(self):
        started.append(Fake())
        return started[-1]

    monkeypatch.setattr(SandboxPool, "_start", start)
    workers = SandboxPool(True, Limits(), 1000, size=1)
    workers.fill()
    assert len(started) == 1
    first = workers.take(refill=False)
    assert first is started[0] and len(started) == 1 and not workers._warm  # nothing competes with the check
    workers.fill()  # after the check (the checker's prewarm)
    assert len(started) == 2 and workers._warm == [started[1]]
    assert workers.take() is started[1] and len(started) == 3  # the grader's order: replace at once


def _cell_function(source: str, name: str):
    """The function a cell of ``source`` defines, with the cell's source where the check finds it."""
    import linecache

    filename = f"<graded-cell-{name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict = {}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["hard_attention_weights"]


_HARD = """import torch
def hard_attention_weights(scores):
    return torch.nn.functional.one_hot(scores.argmax(dim=-1), scores.shape[-1]).to(scores.dtype)
"""


def test_the_check_keeps_its_zygote_only_while_a_part_has_not_passed(monkeypatch):
    """A learner still working keeps the zygote for the next check; a finished notebook (every part passed)
    stops it, so that it holds no memory for nothing."""
    from attention_course.grading import sandbox
    from attention_course.grading.judge import PASSED

    released: list[str] = []
    monkeypatch.setattr(sandbox, "release", lambda isolation="auto", **kwargs: released.append(isolation))
    exercise = get_exercise("ex02")
    checker = Checker(exercise, seed=0, isolated=True)
    for part in exercise.parts[1:]:  # every other part has passed already
        checker._verdicts[part.name] = PartVerdict(part.name, part.points, PASSED, "passed")
    checker.hard_attention_weights(_cell_function(_HARD.replace("argmax", "argmin"), "wrong"))
    assert checker._verdicts["hard_attention_weights"].cases and released == []  # ran, failed: zygote kept
    assert not checker.passed("hard_attention_weights")
    checker.hard_attention_weights(_cell_function(_HARD, "right"))
    assert checker.passed("hard_attention_weights") and released == ["auto"]  # all passed: zygote stopped


# --- h. every known mistake is named, not only measured (issue 43, item 4) ------------------------------------
#: Words that name no mistake: the generic comparisons every wrong answer gets.
NUMBER_ONLY = re.compile(r"differs? from|by up to|expected your \w+ of shape|^your output$")


@functools.cache
def _failure_text(name: str) -> tuple[PartVerdict, str]:
    """The verdict of the named mutant's part (seed 0, judged in this process) and its failing cases' messages."""
    mutant = next(m for m in MUTANTS if m.name == name)
    torch.manual_seed(0)
    exercise, namespace = _namespace(apply(mutant))
    verdict = judge_in_process(exercise, namespace, mutant.part, 0)
    said = [case.message for case in verdict.cases if not case.passed] or [verdict.message]
    return verdict, " ".join(" ".join(str(message).split()) for message in said)


@pytest.mark.parametrize("mutant", IN_PROCESS, ids=[m.name for m in IN_PROCESS])
def test_every_known_mistake_is_named_in_its_message(mutant):
    verdict, text = _failure_text(mutant.name)
    assert verdict.score < verdict.max_score, f"{mutant.name} loses no marks"
    assert mutant.says, (f"{mutant.name}: declare in tests/grading/mutants.py (says=...) the words of its message "
                         f"that name the mistake; the message is: {text[:400]}")
    assert not NUMBER_ONLY.search(mutant.says) and re.search(r"[a-z]{3}", mutant.says), (
        f"{mutant.name}: {mutant.says!r} names no mistake")
    assert mutant.says in text, f"{mutant.name}: the message does not say {mutant.says!r}: {text[:600]}"


def test_every_known_mistake_declares_the_words_that_name_it():
    """Every mutant declares in ``says`` the words of its message that name its mistake (issue 43: 186 of 219
    did before, 85%; the others' messages gave only a number or a shape), so a message that falls back to a
    number fails test_every_known_mistake_is_named_in_its_message."""
    unnamed = [m.name for m in MUTANTS if not m.says]
    assert not unnamed, f"mutants that declare no words: {unnamed}"
