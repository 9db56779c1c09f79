"""Shared pytest fixtures: the repository layout and the book configuration; and the cost limit of one test.

No test may take more than ``--max-test-seconds`` (default 60) of **CPU time** in its call (the test's own
body; a shared fixture's setup is paid once and shown by ``--durations``). CPU time, not wall time: it is the
work the test does, the same on an idle machine and on one with every core busy, so the limit judges the test
and not the machine's load. It counts this process and the child processes it waited for (a grader run, a
kernel); a test that mostly waits for a process it does not reap (the browser) is judged by what it does here.
A test over the limit fails with its CPU and wall time; one whose wall time alone is over the limit is only
listed in the summary (the machine was busy, or the test waits on something).

How ``make test`` shares the work between its two workers (``-n 2 --dist loadscope --no-loadscope-reorder``):
a worker takes a unit of work at a time (:func:`pytest_xdist_make_scheduler`): a whole module, so that its
shared fixture (a grader run, the executed notebooks) is made once, on one worker; or one test of a module in
:data:`SPREAD`, whose tests share nothing dear. The heaviest modules (:data:`HEAVY_FIRST`) are handed out
first and the spread tests last, so that both workers stay busy until the end instead of one finishing a long
module alone.
"""

from __future__ import annotations

import re
import resource
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
MAX_TEST_SECONDS = 60.0
_slow_wall: list[tuple[str, float, float]] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--max-test-seconds", type=float, default=MAX_TEST_SECONDS,
                     help="fail a test whose call takes more CPU seconds than this (0: no limit; default 60)")


#: Modules whose tests share no fixture or cache dear enough to keep on one worker: under ``make test``, each of
#: their tests is a unit of work by itself.
SPREAD = frozenset({
    "tests/grading/test_verdicts.py", "tests/grading/test_tolerances.py", "tests/grading/test_checks.py",
    "tests/grading/test_bounds.py", "tests/grading/test_learner_feedback.py", "tests/unit/test_serving.py",
    "tests/unit/test_foundations.py",
})
#: Modules whose tests are units of work by the page of the site their id ends with (``[chapters/x.html]``, or
#: ``[dark-index.html]`` for a mode and a page): a page's tests share one load of it in the browser.
BY_PAGE = frozenset({"tests/browser/test_site_in_browser.py"})
PAGE_ID = re.compile(r"\[(?:[a-z]+-)?([^\[\]]+?\.html)\]$")
#: The modules whose shared fixture takes longest (a grader run over a class, executed notebooks), first first.
HEAVY_FIRST = ("tests/grading/test_grader_scores.py", "tests/grading/test_learners.py",
               "tests/grading/test_attacks.py", "tests/grading/test_sandbox.py")


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadscope``, with this suite's units of work: a whole module (its shared fixtures are made once,
    on one worker), or a single test of a module in :data:`SPREAD`. (pytest-xdist's ``loadgroup``, which
    would say the same with marks, does not group under pytest 9: it renames node ids, which pytest 9 no
    longer allows.) Other ``--dist`` modes are pytest-xdist's own."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleOrSpreadTest(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            page = PAGE_ID.search(nodeid) if _module(nodeid) in BY_PAGE else None
            if page:  # all the tests of one page of the site: one load of it in the browser
                return f"{_module(nodeid)}::{page.group(1)}"
            return nodeid if _module(nodeid) in SPREAD else _module(nodeid)

    return ModuleOrSpreadTest(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker (whose order is the order work is handed out, under ``--no-loadscope-reorder``): the
    modules of :data:`HEAVY_FIRST` first, the tests of :data:`SPREAD` last, so that the long shared fixtures
    start at once and the single tests keep both workers busy to the end. A run without xdist keeps pytest's
    order."""
    if hasattr(config, "workerinput"):

        def rank(item: pytest.Item) -> int:
            module = _module(item.nodeid)
            if module in HEAVY_FIRST:
                return HEAVY_FIRST.index(module)
            return len(HEAVY_FIRST) + (module in SPREAD)

        items.sort(key=rank)  # stable: pytest's order within each rank


def _cpu_seconds() -> float:
    """CPU seconds of this process and of the children it has waited for (user and system)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    limit = item.config.getoption("--max-test-seconds")
    cpu, wall = _cpu_seconds(), time.perf_counter()
    result = yield  # a failing test raises here, and its own failure is reported
    cpu, wall = _cpu_seconds() - cpu, time.perf_counter() - wall
    if limit and cpu > limit:
        pytest.fail(f"{item.nodeid} took {cpu:.1f} s of CPU time ({wall:.1f} s of wall time), over the "
                    f"{limit:g} s one test may take: split it, or share its expensive part in a fixture",
                    pytrace=False)
    if limit and wall > limit:  # reported through the report, so that xdist's controller sees it too
        item.user_properties.append(("over_the_limit_in_wall_time", (wall, cpu)))
    return result


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for key, value in getattr(report, "user_properties", ()):
        if key == "over_the_limit_in_wall_time" and report.when == "call":
            _slow_wall.append((report.nodeid, *value))


def pytest_terminal_summary(terminalreporter) -> None:
    if _slow_wall:
        terminalreporter.section("tests over the limit in wall time only (the machine was busy, or they wait)")
        for nodeid, wall, cpu in _slow_wall:
            terminalreporter.write_line(f"{nodeid}: {wall:.1f} s wall, {cpu:.1f} s CPU")


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def book_config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text())


@pytest.fixture(scope="session")
def repository_url(book_config: dict) -> str:
    return book_config["repository"]["url"].rstrip("/")
