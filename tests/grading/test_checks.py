"""The in-notebook checks: verdicts, messages, robustness to odd outputs, and the wire format."""

from __future__ import annotations

import builtins
import io
import keyword
import math
import os
import pickle
import re
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from attention_course.grading import exercise, get_exercise
from attention_course.grading.checker import Checker
from attention_course.grading.compare import close_problem, finite_problem, rows_sum_problem, tensor_problem
from attention_course.grading.exercises import exercise_ids
from attention_course.grading.notebook_format import TAG_GRADED, cell_tags, notebook_exercise
from attention_course.grading.sandbox import _load_outcomes
from attention_course.grading.wire import describe, is_wire, outcome_of_call, to_wire, unsupported_type
from attention_course.grading.worker import _warm_up_lazy_imports

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = sorted((ROOT / "exercises" / "solutions").glob("*.ipynb"))


def namespace_of(path: Path) -> tuple[object, dict]:
    """The functions a notebook's graded cells define (our own notebooks, so running them here is safe)."""
    nb = nbformat.read(path, as_version=4)
    ex = get_exercise(notebook_exercise(nb))
    namespace: dict = {}
    exec(ex.preamble, namespace)
    for cell in nb.cells:
        if TAG_GRADED in cell_tags(cell):
            exec(cell.source, namespace)
    return ex, namespace


def run_check(checker: Checker, part: str, obj: object, **kwargs) -> str:
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        checker.check(part, obj, **kwargs)
    return buffer.getvalue()


# The solutions' full marks and report on seeds 0-29: tests/grading/test_tolerances.py (one sweep for both).


@pytest.mark.parametrize("path", [ROOT / "exercises" / p.name for p in SOLUTIONS], ids=[p.name for p in SOLUTIONS])
def test_learner_versions_pass_nothing(path):
    ex, namespace = namespace_of(path)
    checker = Checker(ex, seed=0)
    for part in ex.parts:
        text = run_check(checker, part.name, namespace[part.function])
        assert not checker.passed(part.name), f"the learner's starting code passes {part.name}"
        assert "Traceback" not in text
        if ex.id != "bug_hunt":
            assert "Not attempted yet" in text, text


def test_case_lines_progress_and_hint():
    ex, namespace = namespace_of(ROOT / "exercises" / "solutions" / "ex02_hard_and_soft_attention.ipynb")
    checker = Checker(ex, seed=0)
    text = run_check(checker, "attention_pooling", namespace["attention_pooling"], hint=True)
    cases = ex.part("attention_pooling").make_cases(torch.Generator().manual_seed(0))
    for case in cases:
        assert f"PASS  {case.name}" in text
    assert "Hint (concept): " in text and "weighted average" in text
    assert text.strip().endswith("Progress: 1 of 5 parts passed, 1 of 8 points (ex02).")


def test_wrong_answer_gives_specific_messages_and_a_pointer_to_the_hint():
    checker = Checker(get_exercise("ex02"), seed=0)

    def naive(scores, beta=1.0):  # no max subtraction: overflows for large scores
        e = torch.exp(beta * scores)
        return e / e.sum(dim=-1, keepdim=True)

    text = run_check(checker, "soft_attention_weights", naive)
    assert "FAIL  scores around +1e4 (overflow test): row 0 of your weights contains NaN" in text
    assert "PASS  scores (5, 8), beta = 1" in text
    # partial credit: the overflow case fails, the others pass; a degenerate case (a vector: one axis, so no
    # wrong axis can show) passes without counting, and the report says why
    cases = get_exercise("ex02").part("soft_attention_weights").make_cases(torch.Generator().manual_seed(0))
    passed = sum(f"PASS  {case.name}" in text for case in cases)
    credited = [case for case in cases if case.credit]
    earned = sum(f"PASS  {case.name}" in text for case in credited)
    assert 0 < earned < len(credited) < len(cases)
    assert 'check.hint("soft_attention_weights")' in text
    assert f"{passed} of {len(cases)} cases passed, {round(2 * earned / len(credited), 2):g} of 2 points" in text
    assert "PASS  a vector of 7 scores, beta = 0.5 (no credit on its own)" in text
    assert "1 of the passed cases earns nothing on its own: its input hides a known mistake" in " ".join(text.split())


@pytest.mark.parametrize("returned", [
    None, "a string", 3, np.ones((5, 8)), [torch.ones(5, 8)], (torch.ones(5, 8), torch.ones(5, 8)),
    {"weights": torch.ones(5, 8)}, torch.ones(5, 8, dtype=torch.int64), torch.full((5, 8), float("nan")),
    object(), torch.ones(1),
])
def test_odd_outputs_fail_cleanly(returned):
    checker = Checker(get_exercise("ex02"), seed=0)
    text = run_check(checker, "soft_attention_weights", lambda scores, beta=1.0: returned)
    assert "FAIL" in text and "could not be checked" not in text and not checker.passed("soft_attention_weights")


def test_not_a_function_and_unknown_part():
    checker = Checker(get_exercise("ex02"), seed=0)
    text = run_check(checker, "attention_pooling", torch.ones(3))
    assert "expected your function `attention_pooling` itself, got a tensor" in text
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        checker.softmax(torch.softmax)  # an unknown part: one line listing the parts, no traceback
        checker.hint("typo")
    lines = buffer.getvalue().splitlines()
    assert lines == ["ex02 has no part 'softmax'; its parts are: " + ", ".join(p.name for p in checker._exercise.parts)
                     + ".", lines[0].replace("'softmax'", "'typo'")]
    assert "hard_attention_weights" in dir(checker)


def test_exceptions_in_learner_code_are_reported_not_raised():
    checker = Checker(get_exercise("ex02"), seed=0)

    def exits(f, X, perm):
        raise SystemExit(3)

    text = run_check(checker, "equivariance_gap", exits)
    assert "your code raised SystemExit: your code called sys.exit(3)" in text
    text = run_check(checker, "equivariance_gap", lambda f, X, perm: X[10])
    assert "your code raised IndexError" in text


def test_assert_all_passed_names_the_missing_parts(capsys):
    checker = exercise("ex02", seed=0)
    assert "5 parts, 8 points" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="hard_attention_weights"):
        checker.assert_all_passed()


def test_every_exercise_has_hints_and_distinct_fresh_cases():
    for exercise_id in exercise_ids():
        ex = get_exercise(exercise_id)
        for part in ex.parts:
            assert part.hints and all(len(hint) > 40 for hint in part.hints) and part.summary
            first = part.make_cases(torch.Generator().manual_seed(1))
            second = part.make_cases(torch.Generator().manual_seed(2))
            assert [c.name for c in first] == [c.name for c in second], "case names must not depend on the seed"
            pairs = [(a, b) for c1, c2 in zip(first, second) for a, b in zip(c1.args, c2.args)]
            tensors = [(a, b) for a, b in pairs
                       if isinstance(a, torch.Tensor) and a.dtype != torch.bool and a.numel() > 1]
            # A case may instead carry the seed its inputs are drawn from (ex16's batch): an int that differs.
            seeds = [(a, b) for a, b in pairs if type(a) is int and type(b) is int]
            assert any(not torch.equal(a, b) for a, b in tensors) or any(a != b for a, b in seeds), (
                f"{part.name}: cases are not random")
            pickle.dumps(first)  # cases travel to the learner's process


# --- compare helpers ------------------------------------------------------------------------------------
def test_compare_messages_name_the_place():
    weights = torch.tensor([[0.5, 0.5], [0.2, 0.8], [0.5, 0.23]])
    assert rows_sum_problem(weights) == "row 2 of your weights sums to 0.73 instead of 1"
    batched = torch.ones(2, 3, 4) / 4
    batched[1, 2, 0] = float("nan")
    assert finite_problem(batched, "your weights") == "row 2 of batch item 1 of your weights contains NaN"
    assert tensor_problem(torch.ones(2, 5, 4, 4), "your weights", (2, 4, 5, 5)) == (
        "expected your weights of shape (2, 4, 5, 5), got (2, 5, 4, 4)")
    message = close_problem(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.63]), "your output", "the reference")
    assert message.startswith("your output differs from the reference by up to 0.63 at index (1,)")
    assert close_problem(torch.tensor([1.0]), torch.tensor([1.0 + 1e-7]), "x", "y") is None


# --- wire format ----------------------------------------------------------------------------------------
def test_wire_keeps_plain_data_and_marks_the_rest():
    class MyTensor(torch.Tensor):
        pass

    value = to_wire({"a": (torch.ones(2, requires_grad=True) * 2, 1, 2.5, None, "s"), "b": [True]})
    assert is_wire(value) and type(value["a"][0]) is torch.Tensor and not value["a"][0].requires_grad
    assert type(to_wire(torch.ones(2).as_subclass(MyTensor))) is torch.Tensor
    assert to_wire(np.float32(0.5)) == 0.5 and to_wire(np.float64(2.0)) == 2.0
    assert unsupported_type(to_wire(np.ones(3))) == "numpy.ndarray"
    assert describe(to_wire(np.ones(3))) == "an object of type numpy.ndarray"
    assert not is_wire(np.ones(3)) and not is_wire(torch.ones(1).as_subclass(MyTensor))
    with pytest.raises(ValueError, match="more than"):
        to_wire(torch.zeros(6_000_000))


def test_outcome_of_call_never_raises():
    assert outcome_of_call(lambda: (_ for _ in ()).throw(NotImplementedError()))["status"] == "not_implemented"
    assert outcome_of_call(lambda: (_ for _ in ()).throw(KeyboardInterrupt()))["type"] == "KeyboardInterrupt"
    assert outcome_of_call(lambda: torch.zeros(6_000_000))["status"] == "error"


class _Payload:
    def __reduce__(self):
        import os
        return (os.system, ("touch /tmp/attention-course-grading-pwned",))


def test_result_files_are_read_without_running_code(tmp_path):
    marker = Path("/tmp/attention-course-grading-pwned")
    marker.unlink(missing_ok=True)
    path = tmp_path / "part.pt"
    torch.save([_Payload()], path)
    assert "could not be read" in _load_outcomes(path, 1)
    assert not marker.exists()
    from attention_course.grading.wire import encode  # the grader's results format (issue 42: no unpickler)

    path.write_bytes(encode([{"status": "ok", "value": torch.ones(2)}]))
    assert _load_outcomes(path, 1)[0]["status"] == "ok"
    assert _load_outcomes(path, 2) == "its results were incomplete"


def _solution_lines(path: Path) -> dict[str, list[str]]:
    """part -> the code lines (comments stripped, at least 16 characters) of its solution block."""
    from attention_course.grading.notebook_format import BEGIN_SOLUTION, BUGGY, END_SOLUTION, cell_part

    found: dict[str, list[str]] = {}
    for cell in nbformat.read(path, as_version=4).cells:
        if TAG_GRADED not in cell_tags(cell):
            continue
        inside, lines = False, []
        for line in cell.source.splitlines():
            if line.strip() == BEGIN_SOLUTION:
                inside = True
            elif line.strip() in (END_SOLUTION, BUGGY):
                inside = False
            elif inside and len("".join(line.split("#")[0].split())) >= 16:
                lines.append(line.split("#")[0].strip())
        found.setdefault(cell_part(cell), []).extend(lines)
    return found


# Exercises whose parts all have a concept and an approach hint (newer ones may start with one tier).
TWO_TIERS = {"ex02", "ex03", "ex04", "ex05", "ex06", "ex07", "ex08", "ex09", "ex10", "ex11", "ex13", "bug_hunt"}


#: Exercises whose hints other sessions are rewriting (issue 43 leaves ex16 and ex17 to them): held to the old rule,
#: exact copies only, until their hints pass :func:`copied_code` (ex16's patch_recovered_share gives its formula).
EXACT_HINT_RULE = {"ex16", "ex17"}
_KEPT_NAMES = {"torch", "F", "nn", "math", "ac", *keyword.kwlist, *dir(builtins)}
_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+(?:\.\d*)?|==|!=|<=|>=|\*\*|//|->|[^\s\w]")


def normalised_tokens(text: str) -> list[str]:
    """``text`` (code or prose) as tokens with every identifier of the learner's own a placeholder ``ID``:
    names after a dot (attributes), keyword-argument names, keywords, builtins and the modules a cell imports
    stay, so that ``torch.cat([old, new], dim=-2)`` and ``torch.cat([past_keys, new_keys], dim=-2)`` match."""
    tokens = _TOKEN.findall(text.replace("'", '"'))
    out = []
    for i, token in enumerate(tokens):
        is_name = token[0].isalpha() or token[0] == "_"
        attribute = i > 0 and tokens[i - 1] == "."
        keyword_argument = i + 1 < len(tokens) and tokens[i + 1] == "=" and (i + 2 == len(tokens) or tokens[i + 2] != "=")
        out.append("ID" if is_name and token not in _KEPT_NAMES and not attribute and not keyword_argument else token)
    return out


def copied_code(line: str, hint: str, length: int = 6, solid: int = 3) -> str | None:
    """A run of at least ``length`` normalised tokens of a solution ``line`` that ``hint`` contains, with at least
    ``solid`` tokens that are code (not a placeholder, a comma or a parenthesis, which shapes like ``(B, L)``
    are made of); ``None`` when there is none."""
    code, text = normalised_tokens(line), " " + " ".join(normalised_tokens(hint)) + " "
    for start in range(len(code) - length + 1):
        for end in range(len(code), start + length - 1, -1):
            run = code[start:end]
            if sum(token not in ("ID", ",", "(", ")") for token in run) >= solid and f" {' '.join(run)} " in text:
                return " ".join(run)
    return None


def test_the_hint_rule_sees_through_renamed_variables():
    line = "keys = torch.cat([past_keys, new_keys], dim=-2)"
    assert copied_code(line, "torch.cat([old, new], dim=-2) puts the new positions last")
    assert copied_code("allowed = torch.ones(length, length, dtype=torch.bool).tril()",
                       "e.g. torch.ones(L, L, dtype=torch.bool).tril()")
    assert copied_code(line, "join the cached tensor and the new one along the second-to-last dimension") is None
    assert copied_code("return x.view(batch, length, heads, d).transpose(1, 2)", "shape (B, L, H, D)") is None


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.name for p in SOLUTIONS])
def test_hints_come_in_two_tiers_without_solution_code(path):
    ex = get_exercise(notebook_exercise(nbformat.read(path, as_version=4)))
    for part_name, lines in _solution_lines(path).items():
        hints = ex.part(part_name).hints
        assert hints and all(len(hint) > 40 for hint in hints), part_name
        if ex.id in TWO_TIERS:
            assert len(hints) == 2, f"{ex.id}.{part_name}: a concept hint and an approach hint"
        for hint in hints:
            for line in lines:
                if ex.id in EXACT_HINT_RULE:  # not yet held to the renamed-copy rule: exact copies only
                    assert "".join(line.split()) not in "".join(hint.split()), f"{ex.id}.{part_name}: `{line}`"
                    continue
                copied = copied_code(line, hint)
                assert copied is None, f"{ex.id}.{part_name}'s hint gives the code of `{line}`: {copied}"


def test_hint_levels_and_unknown_levels():
    checker = Checker(get_exercise("ex04"), seed=0)
    part = get_exercise("ex04").part("attention_matrix_form")
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        checker.hint("attention_matrix_form")
        checker.hint("attention_matrix_form", 2)
        checker.hint("attention_matrix_form", 3)
    text = buffer.getvalue()
    assert "Hint (concept): " in text and "Hint 2 (approach): " in text
    assert " ".join(part.hints[0].split()[:6]) in " ".join(text.split())
    assert 'More: check.hint("attention_matrix_form", 2)' in text
    assert text.splitlines()[-1].strip().startswith("attention_matrix_form has hint levels 1 to 2")


def test_an_input_changed_in_place_fails_the_case_and_is_named():
    checker = Checker(get_exercise("ex04"), seed=0, isolated=False)

    def attend_one_query(q, K, V):
        q /= math.sqrt(q.shape[-1])  # in place: the caller's q changes
        weights = torch.softmax(K @ q, dim=-1)
        return weights @ V, weights

    text = run_check(checker, "attend_one_query", attend_one_query)
    assert "your function changed its input `q` in place" in text
    assert not checker.passed("attend_one_query")

    def masked(scores, mask):
        mask.logical_not_()
        return torch.softmax(scores.masked_fill(mask, -1e9), dim=-1)

    text = run_check(Checker(get_exercise("ex05"), seed=0, isolated=False), "masked_softmax", masked)
    assert "changed its input `mask` in place" in text


def test_the_memory_case_measures_the_call_whatever_the_process_did_before():
    """ex11's memory cases must see a full score matrix and must not blame a tiled loop, even after the
    process freed large blocks (glibc then serves allocations from resident free pages, and a forked child
    inherits its parent's peak resident set)."""
    from attention_course.grading.exercises.ex11 import MEMORY_ALLOWANCE
    from attention_course.tiled import tiled_attention

    def full_matrix(query, key, value, block):
        return torch.softmax(query @ key.transpose(-2, -1) / query.shape[-1] ** 0.5, dim=-1) @ value

    def tiles(query, key, value, block):
        return tiled_attention(query, key, value, block_size=block)

    _warm_up_lazy_imports()  # as the grading worker does before any job (PyTorch's lazy imports are not the call's)
    part = get_exercise("ex11").part("tiled_attention")
    cases = [c for c in part.make_cases(torch.Generator().manual_seed(0)) if c.data.get("memory")]
    assert len(cases) == 2
    kept = []
    for case in cases:
        big = torch.ones(40 << 20, dtype=torch.uint8)  # the peak, and glibc's mmap threshold, go up
        del big
        freed = [torch.ones(10 << 20, dtype=torch.uint8) for _ in range(6)]  # from the heap now
        kept.append(torch.ones(1 << 20, dtype=torch.uint8))  # above them: the heap keeps their pages
        del freed
        full_matrix_bytes = case.args[0].shape[-2] * case.args[1].shape[-2] * 4
        assert part.run(full_matrix, case)[1] >= full_matrix_bytes, case.name
        assert part.run(tiles, case)[1] <= MEMORY_ALLOWANCE, case.name


def test_the_memory_case_counts_a_score_matrix_written_into_a_buffer_made_before_the_call():
    """A buffer allocated (and touched) when the cell ran, or in the small warm-up call, and then filled with the
    whole score matrix adds nothing to the peak resident set; the memory case must still refuse it, and must
    still pass a tiled loop, in PyTorch or in NumPy."""
    from attention_course.grading.exercises.ex11 import MEMORY_ALLOWANCE
    from attention_course.tiled import tiled_attention

    prepared = torch.ones(2100 * 2100)  # "when the cell ran": resident before the measured process exists
    kept: dict[str, torch.Tensor] = {}

    def into_prepared(query, key, value, block):
        scores = prepared[:query.shape[-2] * key.shape[-2]].view(query.shape[-2], key.shape[-2])
        torch.matmul(query, key.transpose(-2, -1), out=scores)  # no new memory: every op writes in place
        scores.mul_(query.shape[-1] ** -0.5)
        torch.softmax(scores, dim=-1, out=scores)
        return scores @ value

    def prepared_in_warm_up(query, key, value, block):
        if "scores" not in kept:
            kept["scores"] = torch.empty(2100 * 2100)
        kept["scores"].fill_(0.0)  # every page written already in the small call
        scores = kept["scores"][:query.shape[-2] * key.shape[-2]].view(query.shape[-2], key.shape[-2])
        torch.matmul(query, key.transpose(-2, -1), out=scores)
        scores.mul_(query.shape[-1] ** -0.5)
        torch.softmax(scores, dim=-1, out=scores)
        return scores @ value

    def numpy_tiles(query, key, value, block):
        q, k, v = (t.numpy().astype(np.float64) for t in (query, key, value))
        out = np.empty((q.shape[0], v.shape[1]))
        for q0 in range(0, q.shape[0], block):
            scores = q[q0:q0 + block] @ k[:block].T / math.sqrt(q.shape[1])
            top = scores.max(axis=1, keepdims=True)
            total, acc = np.exp(scores - top).sum(axis=1, keepdims=True), np.exp(scores - top) @ v[:block]
            for k0 in range(block, k.shape[0], block):
                scores = q[q0:q0 + block] @ k[k0:k0 + block].T / math.sqrt(q.shape[1])
                new_top = np.maximum(top, scores.max(axis=1, keepdims=True))
                total = total * np.exp(top - new_top) + np.exp(scores - new_top).sum(axis=1, keepdims=True)
                acc = acc * np.exp(top - new_top) + np.exp(scores - new_top) @ v[k0:k0 + block]
                top = new_top
            out[q0:q0 + block] = acc / total
        return torch.from_numpy(out).to(query.dtype)

    part = get_exercise("ex11").part("tiled_attention")
    cases = [c for c in part.make_cases(torch.Generator().manual_seed(0)) if c.data.get("memory")]
    for case in cases:
        full_matrix_bytes = case.args[0].shape[-2] * case.args[1].shape[-2] * 4
        reference = tiled_attention(*case.args[:3], block_size=case.args[3])
        for cheat in (into_prepared, prepared_in_warm_up):
            output, used = part.run(cheat, case)
            assert torch.allclose(output, reference, atol=1e-4)  # right answers: only the memory gives them away
            assert used >= 0.9 * full_matrix_bytes > MEMORY_ALLOWANCE, (cheat.__name__, case.name, used)
            assert "buffer prepared in advance" in part.verify(case, (output, used))
        output, used = part.run(numpy_tiles, case)
        assert torch.allclose(output, reference, atol=1e-4) and used <= MEMORY_ALLOWANCE, (case.name, used)


#: A process with a long history (a test session, or a notebook whose cells allocated and freed a lot): a heap
#: full of holes and half-used pages, many half-used pools of Python objects.
_FRAGMENTED_PROCESS = """
import random, nbformat, torch
from attention_course.grading import get_exercise
from attention_course.grading.notebook_format import TAG_GRADED, cell_tags
rng = random.Random(0)
blocks = [torch.ones(rng.randrange(16, 16384)) for _ in range(20000)]
del blocks[::2]
objects = [[i] * rng.randrange(1, 20) for i in range(200000)]
del objects[::2]
exercise = get_exercise("ex11")
namespace = {}
exec(exercise.preamble, namespace)
for cell in nbformat.read("exercises/solutions/ex11_efficient_attention.ipynb", as_version=4).cells:
    if cell.cell_type == "code" and TAG_GRADED in cell_tags(cell):
        exec(cell.source, namespace)
part = exercise.part("tiled_attention")
cases = [c for c in part.make_cases(torch.Generator().manual_seed(0)) if c.data.get("memory")]
print(*(part.run(namespace["tiled_attention"], case)[1] for case in cases for _ in range(2)))
"""


def test_the_memory_case_passes_a_tiled_loop_in_a_process_with_a_fragmented_heap():
    """What the process did before the call must not count as the call's memory: in a process whose heap is full
    of holes, a peak inherited from before the call (6.5 MiB above the resident set once freed pages went back)
    and the scattered pages any call writes in place (up to 10 MiB) once failed the solution's tiled loop."""
    from attention_course.grading.exercises.ex11 import MEMORY_ALLOWANCE

    run = subprocess.run([sys.executable, "-c", _FRAGMENTED_PROCESS], capture_output=True, text=True, timeout=600,
                         cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr
    used = [int(number) for number in run.stdout.split()]
    assert len(used) == 4 and max(used) <= MEMORY_ALLOWANCE / 2, used


@pytest.mark.parametrize(("name", "other", "source"), [
    ("W_q", "W_k", "in_proj_weight"), ("b_k", "b_v", "in_proj_bias"), ("W_q", "W_o", "out_proj"),
    ("b_o", "b_q", "out_proj"),
])
def test_a_parameter_holding_another_names_where_each_comes_from(name, other, source):
    part = get_exercise("ex06").part("params_from_torch")
    case = part.make_cases(torch.Generator().manual_seed(0))[0]
    module = torch.nn.MultiheadAttention(case.data["d_model"], case.data["num_heads"], batch_first=True)
    module.load_state_dict(dict(zip(case.data["names"], case.args)))
    right = {"W_o": module.out_proj.weight.T, "b_o": module.out_proj.bias}
    for i, block in enumerate("qkv"):
        right[f"W_{block}"] = module.in_proj_weight.chunk(3)[i].T
        right[f"b_{block}"] = module.in_proj_bias.chunk(3)[i]
    right = {key: value.detach() for key, value in right.items()}
    assert part.verify(case, right) is None
    message = part.verify(case, {**right, name: right[other]})
    assert message.startswith(f"your {name} holds {other}: ") and source in message, message


@pytest.mark.parametrize("exercise_id", ["ex08", "bug_hunt"])
def test_dropout_with_p_one_that_divides_by_zero_is_told_so_in_both_exercises(exercise_id):
    part = get_exercise(exercise_id).part("dropout")
    case = next(c for c in part.make_cases(torch.Generator().manual_seed(0)) if c.kwargs["p"] == 1.0)
    x = case.args[0]
    assert part.verify(case, torch.zeros_like(x)) is None
    keep = torch.zeros_like(x, dtype=torch.bool)
    message = part.verify(case, x * keep / (1.0 - torch.tensor(1.0)))  # 0 * inf: NaN everywhere
    assert "with p = 1" in message and "divides by zero" in message, message
    assert str(part.verify(case, x * 0.5)) == "with p = 1 every entry must be zero"


def test_a_length_one_self_mask_without_its_diagonal_is_not_called_inverted():
    part = get_exercise("ex10").part("decoder_masks")
    case = next(c for c in part.make_cases(torch.Generator().manual_seed(0)) if c.args[1].size(1) == 1)
    src, _, pad_id = case.args
    memory_mask = (src != pad_id)[:, None, None, :]
    causal = torch.ones(1, 1, dtype=torch.bool).tril()
    assert part.verify(case, (causal, memory_mask)) is None
    message = str(part.verify(case, (causal.tril(-1), memory_mask)))  # the diagonal left out: all False here
    assert "inverted" not in message and "may attend exactly to positions 0..i" in message, message
    # Longer inputs still name an inverted mask.
    longer = next(c for c in part.make_cases(torch.Generator().manual_seed(0)) if c.args[1].size(1) > 1)
    length = longer.args[1].size(1)
    inverted = ~torch.ones(length, length, dtype=torch.bool).tril()
    assert "inverted" in str(part.verify(longer, (inverted, (longer.args[0] != longer.args[2])[:, None, None, :])))


def test_dropout_randomness_false_alarm_rate():
    """The randomness test of dropout masks (ex08 and the bug hunt's part 7) on independent drops: over 200
    seeds of ex08's four training cases, two calls each (2400 statistics), no |z| comes near the threshold of 7
    (measured over 2000 seeds: the largest was 4.42, as normal statistics give; a false alarm has probability
    about 3e-12 per statistic). A golden-ratio sequence that drops exactly p is caught in every case."""
    from attention_course.grading.exercises.ex08 import RANDOMNESS_Z, dropout_randomness

    cases = [((200, 500), 0.2), ((4, 100, 100), 0.5), ((300, 300), 0.9), ((100, 100), 0.3)]
    largest = 0.0
    for seed in range(200):
        g = torch.Generator().manual_seed(seed)
        for shape, p in cases:
            first, second = torch.rand(shape, generator=g) < p, torch.rand(shape, generator=g) < p
            largest = max(largest, *map(abs, dropout_randomness(first, p, second).values()))
    assert largest < 5.5 < RANDOMNESS_Z, largest
    golden = 0.6180339887498949
    for shape, p in cases:
        n = math.prod(shape)
        sequence = [(torch.arange(n, dtype=torch.float64) * golden + call * 0.7548776662466927).remainder(1.0)
                    .reshape(shape) < p for call in (1, 2)]
        z = dropout_randomness(sequence[0], p, sequence[1])
        assert max(abs(z["neighbours"]), -z["rows"], abs(z["calls"])) > RANDOMNESS_Z, (shape, p, z)
