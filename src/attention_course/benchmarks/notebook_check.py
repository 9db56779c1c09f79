"""How long a learner waits for ``check.<part>(fn)`` in a notebook: seconds per check, median and maximum.

A simulated learner checks ex02's ``soft_attention_weights`` (the solution, from a module so that its
source is known as a notebook cell's is) ``CHECKS`` times, pausing ``PAUSE`` seconds between checks as a
learner reads the result and edits code. Each check runs the whole path the notebook uses: the graded
source into a fresh sandboxed worker (bubblewrap where it works), the cases, the judge and the report.
Three settings: ``warm`` as the notebook runs it (``exercise(...)`` starts the kernel's zygote ahead of need
and each check forks a fresh process from it), ``back_to_back`` (the same without pauses: a learner who
re-runs every cell, or the book build executing a solution notebook), and ``cold`` (every check starts its
own sandbox: Python and PyTorch imports included), for comparison. Wall-clock seconds, on whatever else
the machine is running (its load average is reported); the CPU seconds the notebook's own process spends
per check (cases, judge, report) too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

CHECKS = 10
PAUSE = 5.0

_SOLUTION = '''import torch


def soft_attention_weights(scores, beta=1.0):
    logits = beta * scores
    logits = logits - logits.amax(dim=-1, keepdim=True)
    exp = torch.exp(logits)
    return exp / exp.sum(dim=-1, keepdim=True)
'''


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _checks(function, warm: bool, checks: int, pause: float) -> dict:
    from attention_course.grading import get_exercise, launcher, sandbox
    from attention_course.grading.checker import Checker

    launcher.close_pools()
    checker = Checker(get_exercise("ex02"), seed=0, isolated=True)
    if warm:
        sandbox.prewarm(reuse=True)
    times: list[float] = []
    cpu = 0.0
    for _ in range(checks):
        time.sleep(pause)
        if not warm:
            launcher.close_pools()  # no worker left from the check before
        used, start = _cpu(), time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()) as shown:
            checker.check("soft_attention_weights", function)
        times.append(time.perf_counter() - start)
        cpu += _cpu() - used
        if "Passed: all" not in shown.getvalue():
            raise RuntimeError(f"the solution did not pass: {shown.getvalue()}")
    launcher.close_pools()
    return {"median_seconds": statistics.median(times), "max_seconds": max(times),
            "seconds": [round(t, 3) for t in times], "checker_cpu_seconds_per_check": cpu / checks}


def run(checks: int = CHECKS, pause: float = PAUSE) -> dict:
    with tempfile.TemporaryDirectory(prefix="check-benchmark-") as tmp:
        path = Path(tmp) / "learner_cell.py"
        path.write_text(_SOLUTION)
        spec = importlib.util.spec_from_file_location("learner_cell", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        warm = _checks(module.soft_attention_weights, True, checks, pause)
        back_to_back = _checks(module.soft_attention_weights, True, checks, 0.0)
        cold = _checks(module.soft_attention_weights, False, max(3, checks // 3), pause)
    return {"median_seconds": warm["median_seconds"], "max_seconds": warm["max_seconds"], "warm": warm,
            "back_to_back": back_to_back, "cold": cold, "pause_seconds": pause, "cores": os.cpu_count(),
            "load_average": os.getloadavg()[0]}


if __name__ == "__main__":  # pragma: no cover - python -m attention_course.benchmarks.notebook_check [N]
    import json
    import sys

    print(json.dumps(run(int(sys.argv[1]) if len(sys.argv) > 1 else CHECKS), indent=2))
