"""The notebook check's zygote: one sandbox per kernel imports PyTorch once and forks a process per check.

Each check must still run as if in a sandbox of its own: a fresh process, nothing left running or written
by the check before it, no way to reach the zygote; a check that ends badly takes the zygote with it. The
grader never uses a zygote (every notebook attempt gets a sandbox of its own).
"""

from __future__ import annotations

import pytest
import torch

from attention_course.grading import get_exercise, isolation, launcher, sandbox

PART = "soft_attention_weights"
SOLUTION = "import torch\ndef soft_attention_weights(scores, beta=1.0):\n    return torch.softmax(beta * scores, dim=-1)\n"

LEAVES_THINGS_BEHIND = SOLUTION + """
import os, time
with open("/tmp/left-behind.txt", "w") as left:
    left.write("from the check before")
os.makedirs("/tmp/folder-left/inside", exist_ok=True)
if os.fork() == 0:  # a daemon in a session of its own, outliving its check
    os.setsid()
    time.sleep(300)
    os._exit(0)
"""

FINDS_NOTHING_LEFT = SOLUTION + """
import os
assert not os.path.exists("/tmp/left-behind.txt"), "a file of the check before is still in /tmp"
assert not os.path.exists("/tmp/folder-left"), "a folder of the check before is still in /tmp"
def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"
running = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid(), os.getppid())
           and _state(p) not in ("Z", "X")]
assert not running, f"processes of the check before still run: {running}"
try:
    os.listdir(f"/proc/{os.getppid()}/fd")
except PermissionError:
    pass
else:
    raise AssertionError("the check's process can read the zygote's file descriptors")
sockets = []
for fd in os.listdir("/proc/self/fd"):
    try:
        sockets += [fd] if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:") else []
    except OSError:
        pass
assert not sockets, f"the check's process holds a socket (the zygote's control socket?): {sockets}"
"""

ENDS_BADLY = SOLUTION + "\nimport os\nos._exit(7)\n"


@pytest.fixture()
def bwrap():
    if isolation.bwrap_path() is None:
        pytest.skip("bubblewrap is not installed (make grader-deps installs it): the zygote's sandbox needs it")
    launcher.close_pools()
    yield
    launcher.close_pools()


def _check(source: str, isolation_mode: str = "required") -> sandbox.SandboxResult:
    part = get_exercise("ex02").part(PART)
    cases = part.make_cases(torch.Generator().manual_seed(0))
    return sandbox.run_parts("ex02", "import torch", [(0, PART, source)], [(PART, cases)], timeout=20,
                             isolation=isolation_mode, reuse=True)


def _idle_zygote(isolated: bool = True) -> launcher.Zygote:
    pool = launcher.zygote_pool(isolated, isolation.Limits(), sandbox.DEFAULT_OUTPUT_LIMIT)
    assert len(pool._idle) == 1, "after a clean check the pool keeps exactly one zygote"
    return pool._idle[0]


def test_checks_fork_from_one_zygote_and_find_nothing_the_check_before_left(bwrap):
    first = _check(LEAVES_THINGS_BEHIND)
    assert not first.cell_errors and not first.failures and len(first.outcomes[PART]) > 0, first
    zygote = _idle_zygote()
    second = _check(FINDS_NOTHING_LEFT)
    assert not second.cell_errors and not second.failures, (second.cell_errors, second.failures)
    assert _idle_zygote() is zygote and zygote.alive() and zygote.jobs == 2  # no second start-up


def test_a_check_that_ends_badly_takes_the_zygote_with_it(bwrap):
    _check(SOLUTION)
    zygote = _idle_zygote()
    result = _check(ENDS_BADLY)
    # The cell that killed its process is blamed and the part rerun without it, in a new zygote.
    assert "ended the checking process" in result.cell_errors[PART] and result.processes == 2, result
    assert not zygote.alive() and zygote.sandbox._killed
    fresh = _idle_zygote()
    assert fresh is not zygote and fresh.alive()
    assert not _check(FINDS_NOTHING_LEFT).cell_errors


def test_a_check_that_hangs_is_stopped_and_the_next_check_starts_a_new_zygote(bwrap, monkeypatch):
    hangs = SOLUTION + "\nimport time\ntime.sleep(300)\n"
    part = get_exercise("ex02").part(PART)
    cases = part.make_cases(torch.Generator().manual_seed(0))
    result = sandbox.run_parts("ex02", "import torch", [(0, PART, hangs)], [(PART, cases)], timeout=2,
                               isolation="required", reuse=True, budget=4)
    assert "time" in result.cell_errors.get(PART, "") + result.failures.get(PART, ""), result
    pool = launcher.zygote_pool(True, isolation.Limits(), sandbox.DEFAULT_OUTPUT_LIMIT)
    assert all(z.alive() for z in pool._idle)
    assert not _check(SOLUTION).failures


def test_without_bubblewrap_the_zygote_runs_unisolated_and_is_reused():
    launcher.close_pools()
    try:
        first, second = _check(SOLUTION, "none"), _check(SOLUTION, "none")
        assert not first.failures and not second.failures and second.isolated is False
        assert _idle_zygote(isolated=False).jobs == 2
    finally:
        launcher.close_pools()


def test_the_grader_never_uses_a_zygote(bwrap, tmp_path):
    import nbformat

    from attention_course.grading.grader import grade_notebook
    from tests.grading.mutants import SOLUTIONS

    path = tmp_path / "ex02.ipynb"
    nbformat.write(nbformat.read(SOLUTIONS / "ex02_hard_and_soft_attention.ipynb", as_version=4), path)
    result = grade_notebook(path, timeout=20, seed=0)
    assert result.score == result.max_score
    assert not [key for key in launcher._pools if key[0] == "zygote"]
