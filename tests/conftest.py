"""Shared pytest fixtures: the repository layout and the book configuration; and the cost limit of one test.

No test may take more than ``--max-test-seconds`` (default 60) of **CPU time** in its call (the test's own
body; a shared fixture's setup is paid once and shown by ``--durations``). CPU time, not wall time: it is the
work the test does, the same on an idle machine and on one with every core busy, so the limit judges the test
and not the machine's load. It counts this process and the child processes it waited for (a grader run, a
kernel); a test that mostly waits for a process it does not reap (the browser) is judged by what it does here.
A test over the limit fails with its CPU and wall time; one whose wall time alone is over the limit is only
listed in the summary (the machine was busy, or the test waits on something).
"""

from __future__ import annotations

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
