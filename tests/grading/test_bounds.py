"""Harm bounded outside the sandbox (issue 23): results, learner text, time, memory, identity.

Each test is an attack that costs the grader (not the attacker) something without its bound: memory when
results inflate or claim more elements than they hold, minutes when IPython's transformer reads a cell of
shell lines, time that grows with the cells a learner brings, host memory shared by a sandbox's children
or held in System V shared memory, a classmate's grade.
"""

from __future__ import annotations

import io
import os
import resource
import shutil
import struct
import zipfile

import pytest
import torch

from attention_course.grading import memory_cgroup
from attention_course.grading.exercises import get_exercise
from attention_course.grading.isolation import Limits, bwrap_path
from attention_course.grading.learner_text import CELL_LIMIT, LearnerTextError, parse, to_python
from attention_course.grading.library_rules import library_problem
from attention_course.grading.report import Roster
from attention_course.grading.sandbox import _load_outcome_bytes, notebook_budget, run_parts
from attention_course.grading.wire import WireFormatError, decode, encode

needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (make grader-deps) is not installed")


def _saved(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- results ------------------------------------------------------------------------------------------
def test_a_pickle_opcode_bomb_is_refused_without_being_run():
    """Issue 42: a part's results that hold a pickle of 4M NONE/POP pairs. PyTorch's weights-only unpickler
    runs every opcode in Python (about 35 s and 620 MiB for 8M opcodes, in the grader's own process); the
    grader now reads results with the wire's own parser, which refuses these bytes at their first four."""
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02" + b"N0" * 4_000_000 + b"N.")
        archive.writestr("archive/version", b"3\n")
    started = _cpu()
    loaded = _load_outcome_bytes(bomb.getvalue(), 1)
    assert isinstance(loaded, str) and "wire format" in loaded, loaded
    assert _cpu() - started < 0.5


def test_torch_save_bytes_and_zips_are_not_the_wire_format():
    """A learner who replaces the worker's encoder (or writes to the channel) and sends torch.save bytes,
    even a small zip whose record inflates to 200 MB: refused from their first bytes, nothing inflated."""
    honest = encode([{"status": "ok", "value": torch.ones(3)}])
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w") as target:
        target.writestr("archive/data/0", bytes(200_000_000), compress_type=zipfile.ZIP_DEFLATED)
    started = _cpu()
    for data in (bomb.getvalue(), _saved([{"status": "ok", "value": torch.ones(3)}])):
        loaded = _load_outcome_bytes(data, 1)
        assert isinstance(loaded, str) and "wire format" in loaded, loaded
    assert _cpu() - started < 1.0  # nothing was inflated
    assert _load_outcome_bytes(honest, 1)[0]["value"].tolist() == [1.0, 1.0, 1.0]


def test_the_wire_carries_every_wire_type_exactly():
    value = [{"status": "ok", "value": (torch.randn(2, 3), torch.tensor(True), torch.zeros(0, 4, dtype=torch.int64),
                                        torch.ones(2, dtype=torch.bfloat16), torch.randn(3, dtype=torch.complex64),
                                        [1, -2**70, 2.5, float("nan"), None, True, "é"], {"k": torch.arange(4)})},
             {"status": "error", "type": "ValueError", "message": "m", "where": "line 1"}]
    decoded = decode(encode(value))
    assert type(decoded[0]["value"]) is tuple and type(decoded[0]["value"][5]) is list
    for sent, came in zip(value[0]["value"][:5], decoded[0]["value"][:5]):
        assert came.dtype == sent.dtype and came.shape == sent.shape and torch.equal(came, sent)
    assert decoded[0]["value"][5][:3] == [1, -2**70, 2.5] and decoded[0]["value"][5][4:] == [None, True, "é"]
    assert decoded[1] == value[1]
    assert torch.equal(decoded[0]["value"][6]["k"], torch.arange(4))


def test_the_wire_parser_checks_every_limit_before_it_builds():
    """Each claim is checked against the limits and the bytes that came before anything is allocated."""
    cases = {
        "elements": b"ACW1X" + struct.pack("<BBB", 0, 0, 2) + struct.pack("<2Q", 1_000_000, 1_000_000) + bytes(4),
        "ends early": b"ACW1X" + struct.pack("<BBB", 0, 0, 1) + struct.pack("<Q", 1000) + bytes(4),
        "items": b"ACW1l" + struct.pack("<I", 2**31),
        "nested": b"ACW1" + b"l\x01\x00\x00\x00" * 40 + b"N",
        "string": b"ACW1s" + struct.pack("<I", 2**31),
        "type tag": b"ACW1P",
        "after its value": b"ACW1NN",
        "decimal": b"ACW1i" + struct.pack("<H", 3) + b"1e5",
        "dtype": b"ACW1X" + struct.pack("<BBB", 200, 0, 0),
    }
    for words, data in cases.items():
        with pytest.raises(WireFormatError, match=words):
            decode(data)


def test_a_tensor_claiming_more_elements_than_it_holds_is_refused():
    """A tensor that claims 10^12 elements over 4 bytes (what a zero-stride view would be): refused."""
    claim = b"ACW1l\x01\x00\x00\x00d\x02\x00\x00\x00" + struct.pack("<I", 6) + b"status" + \
        b"s\x02\x00\x00\x00ok" + struct.pack("<I", 5) + b"value" + b"X" + struct.pack("<BBB", 0, 0, 2) + \
        struct.pack("<2Q", 1_000_000, 1_000_000) + bytes(4)
    loaded = _load_outcome_bytes(claim, 1)
    assert isinstance(loaded, str) and "5,000,000 elements" in loaded, loaded


def test_nested_lists_cost_what_their_bytes_cost():
    """Shared structure (a list holding the same list 1,000 times, 8 deep: 1000^8 values) cannot be written:
    each value must be in the bytes. A million real values stop at the value limit (200,000)."""
    level = b"l" + struct.pack("<I", 1000)
    data = b"ACW1" + level + (level + b"N" * 1000) * 1000
    started = _cpu()
    with pytest.raises(WireFormatError, match="more than 200,000 values"):
        decode(data)
    assert _cpu() - started < 2.0


# --- learner text -------------------------------------------------------------------------------------
def test_a_cell_of_shell_lines_is_read_in_one_pass():
    """200 KB of `!echo` lines: IPython's transformer re-reads the cell once per line (about 36 s per
    reading, five readings per cell); the grader's own pass is linear."""
    cell = "".join(f"!echo {i:06d}\n" for i in range(CELL_LIMIT // 13))
    started = _cpu()
    tree = parse(cell)
    assert library_problem(cell, "ex14", "rotate_pairs") is None
    assert tree is not None and len(tree.body) == CELL_LIMIT // 13
    assert _cpu() - started < 5.0


def test_learner_text_keeps_python_magics_bodies_and_refuses_oversized_cells():
    assert to_python("%%time\nx = 1\n!ls\ny = %pwd\n") == "\nx = 1\npass\ny = None\n"
    assert to_python("%%bash\nrm -rf /\n") == "pass\n"
    with pytest.raises(LearnerTextError, match="more than"):
        to_python("x = 1\n" * (CELL_LIMIT // 6 + 1))
    assert parse("x = (" * 10) is None


def test_the_notebook_budget_does_not_grow_with_cells():
    assert notebook_budget(5, 40, 5) == notebook_budget(5, 2, 5) == notebook_budget(5)


@needs_bwrap
def test_forty_slow_cells_cannot_take_more_than_the_budget():
    """40 cells of 0.4 s each at a 0.5 s step limit: before, the budget grew with the cells (16 s of
    cells, then the function); now the notebook stops at its fixed budget and the part earns nothing."""
    exercise = get_exercise("ex02")
    part = exercise.part("hard_attention_weights")
    cells = [(index, part.name, "import time\ntime.sleep(0.4)\n") for index in range(40)]
    cells.append((40, part.name, "def hard_attention_weights(scores):\n    return scores\n"))
    result = run_parts("ex02", exercise.preamble, cells, [(part.name, part.make_cases(torch.Generator()))],
                       timeout=0.5, budget=3.0)
    assert part.name not in result.outcomes
    assert "time budget" in result.failures[part.name], result.failures


@needs_bwrap
def test_cells_that_end_the_process_cost_attempts_and_budget():
    """Issue 42: ten cells of one part that each call os._exit(1) used to cost a fresh sandbox each (and no
    budget): now a notebook gets at most parts + 2 attempts, each retry charged to its budget."""
    exercise = get_exercise("ex02")
    part = exercise.part("hard_attention_weights")
    cells = [(index, part.name, "import os\nos._exit(1)\n") for index in range(10)]
    cells.append((10, part.name, "def hard_attention_weights(scores):\n    return scores\n"))
    result = run_parts("ex02", exercise.preamble, cells, [(part.name, part.make_cases(torch.Generator()))],
                       timeout=20)
    assert result.processes <= 1 + 2, result.processes
    assert part.name not in result.outcomes
    assert "attempts" in result.failures[part.name], result.failures


def test_carrying_helpers_is_linear_in_the_notebook_and_has_a_deadline():
    """Issue 42: 1.3 MB of helpers that call each other took the carried-definitions analysis 36-50 s
    (quadratic in the helpers); it is now linear, and stops at its deadline."""
    import time

    from attention_course.grading.evaluate import AnalysisTimeout, carried_definitions

    count = 20_000
    helpers = [f"def helper_{i}(x):\n    return helper_{i + 1}(x) + helper_{(i * 7 + 3) % count}(x) + {i}\n"
               for i in range(count)]
    others = ["\n".join(helpers[i:i + 500]) for i in range(0, count, 500)]
    assert sum(map(len, others)) > 1_300_000
    graded = {"hard_attention_weights": "def hard_attention_weights(scores):\n    return helper_0(scores)\n"}
    started = _cpu()
    carried = carried_definitions(graded, others, "import torch", ["hard_attention_weights"])
    assert _cpu() - started < 15.0
    assert len(carried["hard_attention_weights"][1]) == count  # every helper, each visited once
    with pytest.raises(AnalysisTimeout):
        carried_definitions(graded, others, "import torch", ["hard_attention_weights"], deadline=time.monotonic())


# --- memory -------------------------------------------------------------------------------------------
FORK_AND_FILL = """
import os, time
def hard_attention_weights(scores):
    return scores
children = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        block = bytearray(b"x" * 250_000_000)
        time.sleep(3)
        os._exit(0)
    children.append(pid)
try:
    with open("/dev/shm/fill", "wb") as shared:
        for _ in range(15):
            shared.write(b"y" * 10_000_000)
except OSError:
    pass
for pid in children:
    os.waitpid(pid, 0)
"""


@needs_bwrap
def test_children_and_shared_memory_share_one_limit():
    """Three children of 250 MB each (each within its own address-space limit) and 150 MB of shared
    memory: the sandbox's memory cgroup holds all of them to one limit."""
    kind, why = memory_cgroup.cgroup_support()
    if kind != "v1":
        pytest.skip(f"no cgroup v1 memory controller to test here ({kind}: {why})")
    limit = 600 * 2**20
    exercise = get_exercise("ex02")
    part = exercise.part("hard_attention_weights")
    result = run_parts("ex02", exercise.preamble, [(0, part.name, FORK_AND_FILL)],
                       [(part.name, part.make_cases(torch.Generator()))], timeout=30,
                       limits=Limits(sandbox_memory=limit))
    assert result.peak_memory is not None and result.peak_memory <= limit * 1.01, result.peak_memory


SYSV_SEGMENTS = """
import ctypes
IPC_PRIVATE, IPC_CREAT, IPC_RMID, MIB = 0, 0o1000, 0, 2**20
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]


def hard_attention_weights(scores):
    # System V segments belong to no process: made here, they would outlive the sandbox's processes.
    made, mib = [], 0
    for size in [100] * 30 + [700]:  # 3 GB of 100 MB segments, then one of 700 MB
        ident = libc.shmget(IPC_PRIVATE, size * MIB, IPC_CREAT | 0o600)
        if ident >= 0:
            made.append(ident)
            mib += size
    for ident in made:  # never touched, so they cost no memory; removed all the same
        libc.shmctl(ident, IPC_RMID, None)
    return torch.full_like(scores, float(mib))
"""


def _sysv_megabytes(limit: int) -> float:
    """MiB of System V shared memory a sandboxed notebook managed to create (see SYSV_SEGMENTS)."""
    exercise = get_exercise("ex02")
    part = exercise.part("hard_attention_weights")
    result = run_parts("ex02", exercise.preamble, [(0, part.name, SYSV_SEGMENTS)],
                       [(part.name, part.make_cases(torch.Generator()))], timeout=30,
                       limits=Limits(sandbox_memory=limit))
    assert part.name in result.outcomes, (result.failures, result.cell_errors)
    return float(result.outcomes[part.name][0]["value"].flatten()[0])


@needs_bwrap
def test_system_v_shared_memory_is_held_to_the_sandbox_limit(monkeypatch):
    """shmget segments count against no process's address space: the sandbox's IPC namespace gets
    kernel.shm* limits at the sandbox's memory limit. Without them (the control) the same code creates
    3.7 GB of segments."""
    if os.geteuid() != 0 or shutil.which("nsenter") is None:
        pytest.skip("kernel.shm* limits are set as root with nsenter only (not root here, or no nsenter)")
    limit = 600 * 2**20
    assert 0 < _sysv_megabytes(limit) <= limit / 2**20  # some segments, never more than the limit
    monkeypatch.setattr(memory_cgroup, "limit_shared_memory", lambda pid, limit: False)
    assert _sysv_megabytes(limit) == 30 * 100 + 700  # the control: nothing else holds it


def test_without_a_cgroup_the_grader_says_so(monkeypatch):
    monkeypatch.setitem(memory_cgroup._support, "result", ("none", "no controller"))
    message = memory_cgroup.fallback_message()
    assert message and "no memory cgroup" in message and "no controller" in message


# --- identity -----------------------------------------------------------------------------------------
def test_the_roster_matches_whole_path_components():
    roster = Roster([{"email": "alice@uni.edu", "learner_id": "A"}, {"email": "mallory@uni.edu", "learner_id": "M"},
                     {"file": "bob_ex15.ipynb", "learner_id": "B"}])
    assert roster.lookup("subs/mallory@uni.edu/alice@uni.edu ex15.ipynb")[0] == "M"
    assert roster.lookup("subs/mallory@uni.edu/alice@uni.edu/ex15.ipynb")[0] == "M"  # outermost folder wins
    assert roster.lookup("subs/mallory@uni.edu/alice@uni.edu.ipynb")[0] == "M"
    assert roster.lookup("subs/alice@uni.edu/ex15.ipynb")[0] == "A"
    assert roster.lookup("subs/xalice@uni.edu/ex15.ipynb")[0] == ""
    assert roster.lookup("subs/other/bob_ex15.ipynb")[0] == "B"
    assert roster.lookup("subs/other/not_bob_ex15.ipynb")[0] == ""
