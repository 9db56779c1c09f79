"""Grade on Gradescope: an autograder bundle, and the ``results.json`` its run writes.

``python -m attention_course.grading.gradescope bundle EXERCISE OUT`` writes ``OUT/`` and ``OUT.zip`` (upload
the zip as the assignment's autograder). Gradescope extracts the zip into ``/autograder/source``, runs
``setup.sh`` there once to build the image, copies ``run_autograder`` to ``/autograder/run_autograder``, and
for every submission copies the learner's files into ``/autograder/submission``, runs ``run_autograder`` in
``/autograder`` and reads ``/autograder/results/results.json``. So the zip holds, at its root:

- ``setup.sh``: installs Python, bubblewrap, CPU PyTorch (the version the bundle was made with) and the
  course package from ``/autograder/source/package`` into ``/autograder/venv``;
- ``run_autograder``: grades the one notebook in ``/autograder/submission`` and writes the results (a
  results file stating the failure if the grader itself could not run);
- ``package/``: the course package's source (``pyproject.toml``, ``src/attention_course``);
- the exercise's learner notebook, for reference.

``python -m attention_course.grading.gradescope run EXERCISE SUBMISSION_DIR RESULTS_JSON`` is what
``run_autograder`` calls: it grades the one notebook in ``SUBMISSION_DIR`` as ``EXERCISE`` and writes
Gradescope's results format (one test per part: ``name``, ``score``, ``max_score``, ``status``, ``output``
with each case's verdict; the top level ``score``, ``execution_time`` and ``output``).

On Gradescope the learner's code runs only under bubblewrap: where bubblewrap cannot start a sandbox (a
container that forbids namespaces), ``run`` grades nothing, writes a ``results.json`` that says so (0
points) and exits with status 3. Before it writes the results it kills every process that still runs
under a uid it handed to its sandboxes, so nothing the learner started can rewrite the file afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import stat
import sys
import time
from pathlib import Path
from typing import Any

from attention_course.grading.exercises import exercise_ids
from attention_course.grading.isolation import SandboxUnavailable

__all__ = ["GRADESCOPE_HINT", "REFUSED_EXIT", "gradescope_results", "kill_sandbox_processes", "main", "write_bundle"]

#: Exit status of ``run`` when the learner's code cannot be isolated (as the grader's CLI).
REFUSED_EXIT = 3

_SETUP = """\
#!/usr/bin/env bash
# Gradescope runs this once, as root, to build the autograder's image; the zip is extracted in
# /autograder/source. Every step that downloads something is on a line of its own.
set -euo pipefail
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y python3 python3-venv bubblewrap
python3 -m venv /autograder/venv
/autograder/venv/bin/python -m pip install --upgrade pip
/autograder/venv/bin/python -m pip install torch=={torch} --index-url https://download.pytorch.org/whl/cpu
/autograder/venv/bin/python -m pip install /autograder/source/package
"""

_RUN = """\
#!/usr/bin/env bash
# Gradescope runs this for every submission, as root, in /autograder; it must write
# /autograder/results/results.json. The grader writes it; if the grader itself cannot start, this script
# writes one that says so (never an empty result), and exits with the grader's failing status.
set -uo pipefail
SUBMISSION=/autograder/submission
RESULTS=/autograder/results/results.json
mkdir -p /autograder/results
cd /autograder
/autograder/venv/bin/python -m attention_course.grading.gradescope run {exercise} "$SUBMISSION" "$RESULTS"
status=$?
if [ ! -s "$RESULTS" ]; then
  cat > "$RESULTS" <<'JSON'
{{"score": 0, "visibility": "visible", "tests": [],
 "output": "The autograder could not run (the grader did not start). Please tell your instructor."}}
JSON
  [ "$status" -ne 0 ] || status=1
fi
exit "$status"
"""

#: What the instructor can do when ``run`` finds no sandbox: the options of this command (not the CLI's).
GRADESCOPE_HINT = ("for the instructor: the autograder's container must let bubblewrap make namespaces: as root "
                   "with CAP_SYS_ADMIN, or with user namespaces allowed (Docker's default capabilities work; its "
                   "default seccomp profile does not: see chapters/instructors.md); to try the bundle on your own "
                   "notebooks only, `gradescope run EXERCISE SUBMISSION RESULTS --isolation none` runs them "
                   "unisolated")

_REFUSED = ("The autograder did not run your code: it runs learners' code only inside a sandbox "
            "(bubblewrap), and none could be started in this container ({why}). No points were given; "
            "please tell your instructor, who must fix the autograder.")


def _output(verdict: Any) -> str:
    lines = [verdict.cause + "." if verdict.cause else "", verdict.message]
    lines += [f"PASS  {case.name}" if case.passed else f"FAIL  {case.name}: {case.message}" for case in verdict.cases]
    return "\n".join(line for line in lines if line)


def gradescope_results(result: Any, seconds: float | None = None) -> dict[str, Any]:
    """Gradescope's ``results.json`` for one graded notebook (a
    :class:`~attention_course.grading.grader.NotebookResult`): one test per part."""
    tests = [
        {"name": verdict.part, "number": str(number), "score": verdict.score, "max_score": verdict.max_score,
         "status": "passed" if verdict.passed else "failed", "output": _output(verdict), "visibility": "visible"}
        for number, verdict in enumerate(result.parts, start=1)
    ]
    output = f"{result.exercise}: {result.score:g} of {result.max_score} points."
    if result.message:
        output += f" {result.message}"
    return {"score": result.score, "execution_time": round(seconds if seconds is not None else result.seconds, 2),
            "output": output, "visibility": "visible", "stdout_visibility": "hidden", "tests": tests}


def _notebook_in(folder: Path) -> Path | str:
    """The submission's one notebook (symbolic links to folders are not followed), or why there is none."""
    found = []
    for parent, folders, files in os.walk(folder):
        folders[:] = [name for name in folders if name != ".ipynb_checkpoints"]
        found += [Path(parent) / name for name in files if name.lower().endswith(".ipynb")]
    if len(found) != 1:
        return f"expected exactly one .ipynb notebook in the submission, found {len(found)}"
    return found[0]


def _uids_of(pid: str) -> set[int]:
    """The uids of a live process (none for a zombie, which runs nothing and waits for its parent)."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as status:
            for line in status:
                if line.startswith("State:") and line.split()[1] in ("Z", "X"):
                    return set()
                if line.startswith("Uid:"):
                    return {int(uid) for uid in line.split()[1:]}
    except (OSError, ValueError, IndexError):
        pass
    return set()


def _kill_as(uid: int) -> None:
    """``kill(-1, SIGKILL)`` from a child that has become ``uid``: every process of that uid dies but the
    child (which then exits). The child calls nothing but system calls between fork and exit."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
            code = 0
        finally:
            os._exit(code)
    os.waitpid(pid, 0)


def kill_sandbox_processes(uids: range | None = None, rounds: int = 50) -> list[int]:
    """SIGKILL every process whose real, effective, saved or filesystem uid is one of ``uids`` (default: the
    block this grader process hands to its sandboxes as root), until none is left; returns the pids seen.

    Each uid found is swept by a forked child that becomes that uid and calls ``kill(-1, SIGKILL)``, which
    reaches every process of the uid in one call, then ``/proc`` is read again (until a read finds none).
    Only as root (otherwise the sandboxes have no uids of their own and nothing is done)."""
    if os.geteuid() != 0:
        return []
    if uids is None:
        from attention_course.grading.launcher import sandbox_uids

        uids = sandbox_uids(os.getpid())
    seen: list[int] = []
    for _ in range(rounds):
        found = {pid: _uids_of(pid) & set(uids) for pid in os.listdir("/proc") if pid.isdigit()}
        found = {pid: owners for pid, owners in found.items() if owners}
        if not found:
            return seen
        seen += [int(pid) for pid in found if int(pid) not in seen]
        for uid in sorted(set().union(*found.values())):
            _kill_as(uid)
        time.sleep(0.05)
    raise RuntimeError(f"processes of the sandboxes' uids survive {rounds} rounds of SIGKILL: {sorted(seen)}")


def _write(results_path: Path, results: dict[str, Any]) -> None:
    """Write the results in one step (a reader sees the old file or the whole new one)."""
    results_path.parent.mkdir(parents=True, exist_ok=True)
    temporary = results_path.with_name(results_path.name + ".tmp")
    temporary.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, results_path)


def run(exercise_id: str, submission: Path, results_path: Path, timeout: float = 60.0,
        isolation: str = "auto") -> dict[str, Any]:
    """Grade the submission's notebook and write ``results_path``; returns what was written.

    Args:
        isolation: ``"auto"`` or ``"required"`` (the same here): the learner's code runs under bubblewrap or
            not at all; ``"none"`` runs it unisolated, with the grader's rights (only for trying the bundle on
            your own notebooks; every message then says so).

    Where bubblewrap cannot start (``isolation`` not ``"none"``), ``results_path`` is written with 0 points
    and an output that says why nothing was graded, then ``SandboxUnavailable`` (from ``isolation``) is
    raised; the command line turns it into exit status :data:`REFUSED_EXIT`.
    """
    from attention_course.grading.grader import grade_notebook
    from attention_course.grading.isolation import check_sandbox, clean_text
    from attention_course.grading.launcher import close_pools

    if isolation not in ("auto", "required", "none"):
        raise ValueError(f"isolation must be 'auto', 'required' or 'none', got {isolation!r}")
    started = time.monotonic()
    if isolation != "none":
        try:
            check_sandbox(hint=GRADESCOPE_HINT)
        except SandboxUnavailable as exc:
            _write(results_path, {"score": 0, "execution_time": round(time.monotonic() - started, 2),
                                  "output": _REFUSED.format(why=clean_text(exc, 2000)), "visibility": "visible",
                                  "stdout_visibility": "hidden", "tests": []})
            raise
    notebook = _notebook_in(submission)
    if isinstance(notebook, str):
        results: dict[str, Any] = {"score": 0, "execution_time": 0, "output": notebook, "visibility": "visible",
                                   "tests": []}
    else:
        try:
            result = grade_notebook(notebook, timeout=timeout, exercise_id=exercise_id,
                                    isolation="none" if isolation == "none" else "required")
        finally:
            close_pools()  # every sandbox of this run, warm or not, is killed ...
            kill_sandbox_processes()  # ... and so is anything still running under their uids
        results = gradescope_results(result, time.monotonic() - started)
    _write(results_path, results)
    return results


def _package_root() -> Path:
    import attention_course

    return Path(attention_course.__file__).resolve().parents[2]


def _torch_version() -> str:
    import torch

    return torch.__version__.split("+")[0]


def write_bundle(exercise_id: str, out: Path) -> Path:
    """Write the autograder folder ``out`` and ``out.zip`` for ``exercise_id``; returns the zip's path.

    The zip's root holds ``setup.sh``, ``run_autograder``, ``package/`` and the learner notebook: Gradescope
    extracts it into ``/autograder/source`` (see the module docstring)."""
    from attention_course.grading.grader import guess_exercise

    if exercise_id not in exercise_ids():
        raise ValueError(f"unknown exercise {exercise_id!r}; known: {exercise_ids()}")
    root = _package_root()
    if out.exists():
        shutil.rmtree(out)
    package = out / "package"
    package.mkdir(parents=True)
    shutil.copy(root / "pyproject.toml", package / "pyproject.toml")
    for name in ("README.md", "LICENSE"):
        if (root / name).exists():
            shutil.copy(root / name, package / name)
    shutil.copytree(root / "src" / "attention_course", package / "src" / "attention_course",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for notebook in sorted((root / "exercises").glob("*.ipynb")):
        if guess_exercise(notebook) == exercise_id:
            shutil.copy(notebook, out / notebook.name)
    scripts = (("setup.sh", _SETUP.format(torch=_torch_version())),
               ("run_autograder", _RUN.format(exercise=exercise_id)))
    for name, text in scripts:
        path = out / name
        path.write_text(text, encoding="utf-8")
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    Path(f"{out}.zip").unlink(missing_ok=True)
    return Path(shutil.make_archive(str(out), "zip", root_dir=out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attention_course.grading.gradescope",
                                     description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    bundle = commands.add_parser("bundle", help="write an autograder bundle (folder and zip)")
    bundle.add_argument("exercise", choices=exercise_ids())
    bundle.add_argument("out", type=Path, help="folder to write; OUT.zip is written next to it")
    grade = commands.add_parser("run", help="grade a submission folder and write results.json")
    grade.add_argument("exercise", choices=exercise_ids())
    grade.add_argument("submission", type=Path)
    grade.add_argument("results", type=Path)
    grade.add_argument("--timeout", type=float, default=60.0)
    grade.add_argument("--isolation", choices=["auto", "required", "none"], default="auto",
                       help="auto and required: under bubblewrap, else refuse (exit 3); none: unisolated, "
                            "with your rights (never for a class)")
    args = parser.parse_args(argv)
    if args.command == "bundle":
        print(f"wrote {write_bundle(args.exercise, args.out)}: upload it as the autograder of {args.exercise}")
        return 0
    try:
        results = run(args.exercise, args.submission, args.results, args.timeout, args.isolation)
    except SandboxUnavailable as exc:
        print(f"refusing to grade: {exc}", file=sys.stderr)
        return REFUSED_EXIT
    print(results["output"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
