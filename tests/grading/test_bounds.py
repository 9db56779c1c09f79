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

needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (make grader-deps) is not installed")


def _saved(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- results ------------------------------------------------------------------------------------------
def test_a_zip_that_inflates_is_refused_before_it_is_decoded():
    """A learner who replaces torch.save (or writes to the channel) sends a small zip whose record inflates
    to 200 MB: refused from the zip's directory, nothing inflated."""
    honest = _saved([{"status": "ok", "value": torch.ones(3)}])
    bomb = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(honest)) as source, zipfile.ZipFile(bomb, "w") as target:
        for record in source.infolist():
            data = source.read(record)
            if record.filename.endswith("/data/0"):
                data = bytes(200_000_000)  # the storage, made huge
            target.writestr(record.filename, data, compress_type=zipfile.ZIP_DEFLATED)
    assert len(bomb.getvalue()) < 1_000_000
    started = _cpu()
    loaded = _load_outcome_bytes(bomb.getvalue(), 1)
    assert isinstance(loaded, str) and "compressed" in loaded, loaded
    assert _cpu() - started < 1.0  # nothing was inflated
    assert _load_outcome_bytes(honest, 1)[0]["value"].tolist() == [1.0, 1.0, 1.0]


def test_a_tensor_claiming_more_elements_than_it_holds_is_refused():
    """A zero-stride view of one number claims 10^12 elements: comparing it would allocate terabytes."""
    view = torch.zeros(1).expand(1_000_000, 1_000_000)
    loaded = _load_outcome_bytes(_saved([{"status": "ok", "value": view}]), 1)
    assert isinstance(loaded, str) and "plain data" in loaded, loaded


def test_shared_nested_lists_do_not_make_the_check_exponential():
    value: list = [0]
    for _ in range(8):
        value = [value] * 1000  # 1000^8 paths through 8 lists
    started = _cpu()
    loaded = _load_outcome_bytes(_saved([{"status": "ok", "value": value}]), 1)
    assert isinstance(loaded, str)
    assert _cpu() - started < 5.0


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
