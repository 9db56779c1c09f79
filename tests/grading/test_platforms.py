"""The grader on the platforms instructors use, run the way those platforms run it.

**Gradescope.** Its autograder specification: the zip is extracted into ``/autograder/source``; ``setup.sh``
(at the zip's root) runs there once, as root; ``run_autograder`` (at the zip's root) is copied to
``/autograder/run_autograder`` and run in ``/autograder`` for every submission, which Gradescope puts in
``/autograder/submission``; the results are read from ``/autograder/results/results.json``. The fixture
builds that layout at a real ``/autograder`` inside a private mount namespace (bubblewrap, as root, no
network): it unpacks the bundle's zip, runs ``setup.sh`` line by line (the lines that download are
replaced by their offline equivalents, and the test fails if any other line is skipped), then the tests run
``run_autograder`` on a solution, a blank learner notebook and hostile ones, and validate every
``results.json`` against the schema of Gradescope's format (``GRADESCOPE_SCHEMA``).

**GitHub Classroom.** The example workflow's steps are run as the runner runs them, in a temporary checkout:
``run`` steps with bash, the command grader's steps as its source does (``/bin/sh``, its five-variable
environment, pass when the command exits 0), and the points are added up as the grading reporter does,
reading each runner's result from ``<RUNNER ID>_RESULTS`` (the id upper-cased as written: hyphens kept;
``classroom-resources/autograding-grading-reporter``, ``src/main.js`` and ``src/notify-classroom.js``).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest

from attention_course.grading import get_exercise
from attention_course.grading.gradescope import REFUSED_EXIT, kill_sandbox_processes, write_bundle
from attention_course.grading.isolation import bwrap_path
from attention_course.grading.launcher import sandbox_uids
from tests.grading.mutants import MUTANTS, apply, graded_cell
from tests.grading.test_instructor import GRADESCOPE_SCHEMA

ROOT = Path(__file__).resolve().parents[2]
EXERCISE = "ex04"
NOTEBOOK = "ex04_queries_keys_values.ipynb"
SOLUTION = ROOT / "exercises" / "solutions" / NOTEBOOK
LEARNER = ROOT / "exercises" / NOTEBOOK
WORKFLOW = ROOT / ".github" / "classroom" / "autograding.yml"
SITE_PACKAGES = next(Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
HOST_SITE = "/autograder/venv/host-site-packages"  # where the fixture shows this environment's packages
MARKER = "PLATFORM_ATTACK_" + uuid.uuid4().hex[:12]  # in every file or process an attack leaves behind
FORGED = 12345  # the score an attack writes into results.json

needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (make grader-deps) is not installed")
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="binding a real /autograder (and Gradescope's root grader, whose sandboxes get uids "
                              "of their own) needs root; Gradescope runs the autograder as root")


def _jsonschema():
    return pytest.importorskip("jsonschema", reason="jsonschema validates results.json against Gradescope's format")


def _processes_with(marker: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(cmdline.parent.name)
        except OSError:
            continue
    return found


def _files_with(marker: str, folder: Path) -> list[str]:
    """Files under ``folder`` named with or holding ``marker``, but for notebooks (the attack's source)."""
    found = []
    for path in folder.rglob("*"):
        if HOST_SITE.split("/")[-1] in path.parts or path.suffix == ".ipynb" or path.is_symlink():
            continue
        if marker in path.name:
            found.append(str(path))
            continue
        try:
            if path.is_file() and marker.encode() in path.read_bytes():
                found.append(str(path))
        except OSError:
            continue
    return found


# --- Gradescope -------------------------------------------------------------------------------------------
#: The capabilities Docker gives a container by default (moby's defaults): no CAP_SYS_ADMIN.
DOCKER_CAPABILITIES = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
                       "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
                       "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE")


@dataclass
class Autograder:
    """A folder that is ``/autograder`` inside :meth:`run`'s mount namespace, after ``setup.sh`` ran."""

    root: Path
    base: Path
    setup_log: str = ""

    def run(self, argv: list[str], path_prefix: str = "", timeout: float = 600, docker: str | None = None) \
            -> subprocess.CompletedProcess:
        """Run ``argv`` as root in ``/autograder`` with this folder bound there and no network. ``docker``:
        ``"caps"`` keeps only Docker's default capabilities (no CAP_SYS_ADMIN), with /proc unmasked;
        ``"seccomp"``, Docker's defaults: those capabilities, /proc masked, and new user namespaces refused, as
        Docker's default seccomp profile refuses them to a process without CAP_SYS_ADMIN."""
        command = [bwrap_path(), "--die-with-parent", "--unshare-net"]
        pass_fds: tuple[int, ...] = ()
        if docker:
            command += ["--cap-drop", "ALL"]
            for cap in DOCKER_CAPABILITIES:
                command += ["--cap-add", cap]
        if docker == "seccomp":
            from attention_course.grading.isolation import seccomp_fd

            fd = seccomp_fd()
            if fd is None:
                pytest.skip("no seccomp program for this architecture")
            command += ["--seccomp", str(fd)]
            pass_fds = (fd,)
        for entry in sorted(os.listdir("/")):
            path = "/" + entry
            if entry in ("proc", "dev", "autograder"):
                continue
            if os.path.islink(path):
                command += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                command += ["--bind", path, path]
            else:
                command += ["--ro-bind", path, path]
        # Docker masks paths of /proc by default, which stops any new procfs mount in a user namespace; the
        # "caps" container is one run with --security-opt systempaths=unconfined (its /proc fully visible).
        command += ["--bind", "/proc", "/proc"] if docker == "caps" else ["--proc", "/proc"]
        command += ["--dev-bind", "/dev", "/dev", "--bind", str(self.root), "/autograder",
                    "--ro-bind", str(SITE_PACKAGES), HOST_SITE, "--chdir", "/autograder", "--", *argv]
        env = {"PATH": path_prefix + "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": "/root", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}
        try:
            return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout,
                                  pass_fds=pass_fds)
        finally:
            for fd in pass_fds:
                os.close(fd)

    def submit(self, notebook: nbformat.NotebookNode, path_prefix: str = "", docker: str | None = None) \
            -> tuple[subprocess.CompletedProcess, dict, bytes]:
        """Gradescope's part: a fresh submission folder and no results, then ``run_autograder``."""
        for name in ("submission", "results"):
            shutil.rmtree(self.root / name, ignore_errors=True)
        (self.root / "submission").mkdir()
        nbformat.write(notebook, self.root / "submission" / NOTEBOOK)
        run = self.run(["/autograder/run_autograder"], path_prefix, docker=docker)
        raw = (self.root / "results" / "results.json").read_bytes()
        return run, json.loads(raw), raw


# The lines of setup.sh that download, and what the fixture does instead (no network inside the namespace).
_PTH = "import sys; sys.path.insert(0, {site!r})"
OFFLINE = {
    r"^apt-get update$": ": offline: nothing to update",
    r"^DEBIAN_FRONTEND=noninteractive apt-get install -y python3 python3-venv bubblewrap$":
        "command -v python3 && command -v bwrap",
    r"^/autograder/venv/bin/python -m pip install --upgrade pip$": ": offline: the venv keeps the pip it was made with",
    # torch (the version the bundle pins) comes from this test's environment, made visible to the venv:
    r"^/autograder/venv/bin/python -m pip install torch==(?P<torch>[0-9.]+) --index-url "
    r"https://download.pytorch.org/whl/cpu$":
        "echo {pth} > /autograder/venv/lib/python{major}.{minor}/site-packages/_offline_packages.pth",
}
PACKAGE_LINE = "/autograder/venv/bin/python -m pip install /autograder/source/package"


def _offline_setup(setup: str) -> str:
    """setup.sh with each downloading line replaced (see OFFLINE) and pip told not to reach the network."""
    import torch

    lines = []
    for line in setup.splitlines():
        for pattern, offline in OFFLINE.items():
            match = re.match(pattern, line)
            if match:
                if match.groupdict().get("torch"):
                    assert match["torch"] == torch.__version__.split("+")[0], "setup.sh pins another torch"
                pth = shlex.quote(_PTH.format(site=HOST_SITE))
                line = offline.format(pth=pth, major=sys.version_info.major, minor=sys.version_info.minor)
                break
        else:
            if line == PACKAGE_LINE:
                line += " --no-index --no-deps --no-build-isolation --ignore-installed"
            else:  # anything else must be harmless shell: comments, set, the venv
                assert line.startswith(("#", "set -euo pipefail", "python3 -m venv /autograder/venv")) or not line, line
        lines.append(line)
    assert PACKAGE_LINE in setup
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def autograder(tmp_path_factory) -> Autograder:
    if bwrap_path() is None or os.geteuid() != 0:
        pytest.skip("needs bubblewrap and root (see needs_bwrap, needs_root)")
    base = tmp_path_factory.mktemp("gradescope")
    archive = write_bundle(EXERCISE, base / "ex04-autograder")
    root = base / "autograder"
    # Made before the namespace binds into them (bubblewrap would make missing ones 0700, which the
    # sandbox's own uid could not enter); python -m venv then fills the existing folder.
    (root / "venv" / "host-site-packages").mkdir(parents=True)
    for folder in (root, root / "venv"):
        folder.chmod(0o755)
    with zipfile.ZipFile(archive) as bundle:
        assert {"setup.sh", "run_autograder", "package/pyproject.toml", NOTEBOOK} <= set(bundle.namelist())
        bundle.extractall(root / "source")
        for info in bundle.infolist():  # as unzip does: keep the executable bits
            mode = info.external_attr >> 16
            if mode & 0o111:
                (root / "source" / info.filename).chmod(mode & 0o777)
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")  # Gradescope's image build
    # python3 on PATH: this environment's base interpreter (its own folder, so that the venv's python
    # points at the real installation, which the sandboxes bind).
    bin_dir = Path(os.path.realpath(sys.executable)).parent
    assert (bin_dir / "python3").exists()
    setup = _offline_setup((root / "source" / "setup.sh").read_text())
    (base / "setup-offline.sh").write_text(setup)
    done = Autograder(root, base)
    run = done.run(["bash", "-c", f"cd /autograder/source && bash {base / 'setup-offline.sh'}"], f"{bin_dir}:")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    where = done.run(["/autograder/venv/bin/python", "-c", "import attention_course, torch; "
                      "print(attention_course.__file__)"])
    assert where.returncode == 0, where.stderr
    # The grader that runs is the bundle's copy, installed by setup.sh, not this checkout's.
    assert where.stdout.strip().startswith("/autograder/venv/lib/"), where.stdout
    done.setup_log = run.stdout + run.stderr
    return done


def _check_format(results: dict) -> None:
    _jsonschema().validate(results, GRADESCOPE_SCHEMA)


@needs_bwrap
@needs_root
def test_gradescope_solution_earns_every_point(autograder):
    run, results, _ = autograder.submit(nbformat.read(SOLUTION, as_version=4))
    assert run.returncode == 0, run.stdout + run.stderr
    _check_format(results)
    exercise = get_exercise(EXERCISE)
    assert [test["name"] for test in results["tests"]] == [part.name for part in exercise.parts]
    assert [test["max_score"] for test in results["tests"]] == [part.points for part in exercise.parts]
    assert results["score"] == exercise.max_score == sum(test["score"] for test in results["tests"])
    assert all(test["status"] == "passed" for test in results["tests"])
    assert run.stdout.strip().startswith(f"{EXERCISE}: {exercise.max_score} of {exercise.max_score} points")
    assert "UNISOLATED" not in json.dumps(results)


@needs_bwrap
@needs_root
def test_gradescope_blank_learner_notebook_earns_nothing(autograder):
    run, results, _ = autograder.submit(nbformat.read(LEARNER, as_version=4))
    assert run.returncode == 0, run.stdout + run.stderr
    _check_format(results)
    assert results["score"] == 0 and len(results["tests"]) == len(get_exercise(EXERCISE).parts)
    assert all(test["status"] == "failed" and test["score"] == 0 for test in results["tests"])


# Runs at the top of the first part's graded cell: tries to rewrite results.json now, and leaves processes
# (a new session, and a double-forked one) that wait for the grader's results and then overwrite them. They
# are forked, not started as programs: the grader's run-time guard refuses subprocess and exec in graded
# code (a fresh interpreter would run without the guard), but a forked child keeps running Python.
ATTACK = '''
import json as _json, os as _os, pathlib as _pathlib, time as _time
_forged = _json.dumps({{"score": {forged}, "output": "{marker}", "tests": []}})


def _late(forged):
    results = _pathlib.Path("/autograder/results/results.json")
    done = _pathlib.Path("/autograder/results/{marker}")
    for _ in range(1200):  # until the grader has written its results (they lack the marker), then overwrite
        _time.sleep(0.1)
        if done.exists():  # another of the attack's processes has forged them: none outlives the attack
            _os._exit(0)
        try:
            if "{marker}" not in results.read_text():
                break
        except OSError:
            pass
    try:
        results.write_text(forged)
        _pathlib.Path("/autograder/results/{marker}").write_text("{marker}")
    finally:
        _os._exit(0)


for _path in ("/autograder/results/results.json",):
    try:
        _os.makedirs(_os.path.dirname(_path), exist_ok=True)
        open(_path, "w").write(_forged)
    except OSError:
        pass
if _os.fork() == 0:  # a new session
    _os.setsid()
    _late(_forged)
if _os.fork() == 0:  # a double fork: the grandchild is nobody's child
    _os.setsid()
    if _os.fork() == 0:
        _late(_forged)
    _os._exit(0)
'''


def _hostile(base: nbformat.NotebookNode) -> nbformat.NotebookNode:
    cell = graded_cell(base, get_exercise(EXERCISE).parts[0].name)
    cell.source = ATTACK.format(forged=FORGED, marker=MARKER) + "\n" + cell.source
    return base


@needs_bwrap
@needs_root
def test_gradescope_processes_left_by_the_learner_cannot_rewrite_the_results(autograder):
    run, results, raw = autograder.submit(_hostile(nbformat.read(SOLUTION, as_version=4)))
    assert run.returncode == 0, run.stdout + run.stderr
    _check_format(results)
    exercise = get_exercise(EXERCISE)
    # The attack's code does not break the solution below it: the grader's score, printed and written.
    assert results["score"] == exercise.max_score
    assert run.stdout.strip().startswith(f"{EXERCISE}: {exercise.max_score} of {exercise.max_score} points")
    time.sleep(4)  # the attack's processes poll every 0.1 s
    # (the attack's processes are forks of the worker: they died with the sandbox, or nothing would stop
    # them rewriting the file, as the unisolated control below shows)
    assert (autograder.root / "results" / "results.json").read_bytes() == raw
    assert not _files_with(MARKER, autograder.root)


@needs_bwrap
@needs_root
def test_gradescope_attack_succeeds_against_an_unisolated_grader(autograder):
    # The control for the test above: run unisolated (--isolation none, which no bundle script passes), the
    # same notebook does rewrite results.json after the grader has exited, so that test can fail.
    marker_file = autograder.root / "results" / MARKER
    try:
        for name in ("submission", "results"):
            shutil.rmtree(autograder.root / name, ignore_errors=True)
        (autograder.root / "submission").mkdir()
        nbformat.write(_hostile(nbformat.read(SOLUTION, as_version=4)), autograder.root / "submission" / NOTEBOOK)
        run = autograder.run(["/autograder/venv/bin/python", "-m", "attention_course.grading.gradescope", "run",
                              EXERCISE, "/autograder/submission", "/autograder/results/results.json",
                              "--isolation", "none"])
        assert run.returncode == 0, run.stdout + run.stderr
        assert "UNISOLATED" in run.stdout
        deadline = time.monotonic() + 30
        while not marker_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert json.loads((autograder.root / "results" / "results.json").read_text())["score"] == FORGED
    finally:
        # The attack's other process sees the marker file within 0.1 s and exits; left alive, it would forge
        # the results of the next test that uses this autograder.
        time.sleep(2)
        shutil.rmtree(autograder.root / "results", ignore_errors=True)


@needs_bwrap
@needs_root
def test_gradescope_refuses_to_grade_where_bubblewrap_cannot_start(autograder):
    # A container that forbids namespaces, as bubblewrap reports it (the grader finds bwrap on PATH).
    fake = autograder.base / "no-namespaces"
    fake.mkdir(exist_ok=True)
    (fake / "bwrap").write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    (fake / "bwrap").chmod(0o755)
    run, results, _ = autograder.submit(_hostile(nbformat.read(SOLUTION, as_version=4)), path_prefix=f"{fake}:")
    assert run.returncode == REFUSED_EXIT, run.stdout + run.stderr
    _check_format(results)
    assert results["score"] == 0 and results["tests"] == []
    assert "sandbox" in results["output"] and "setting up uid map: Permission denied" in results["output"]
    assert "refusing to grade" in run.stderr
    time.sleep(3)
    # The learner's code never ran: nothing it would have written (now or later, from a forked process).
    assert not _files_with(MARKER, autograder.root)


@needs_bwrap
@needs_root
def test_gradescope_grades_with_dockers_default_capabilities(autograder):
    """Issue 42: as root without CAP_SYS_ADMIN (Docker's default capabilities) the grader's root sandbox
    cannot start; it now makes a user namespace instead (with --disable-userns and the seccomp filter),
    where before run_autograder exited 3 with 0 points. (The container's /proc is unmasked, as with
    ``docker run --security-opt systempaths=unconfined``: under a masked /proc no new procfs can be mounted
    in a user namespace, and the grader refuses, as the next test shows.)"""
    run, results, _ = autograder.submit(nbformat.read(SOLUTION, as_version=4), docker="caps")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    _check_format(results)
    assert results["score"] == get_exercise(EXERCISE).max_score, results["output"]
    assert "UNISOLATED" not in json.dumps(results)
    # The learner's processes still die with the sandbox (its PID namespace and memory cgroup), although as
    # root in a user namespace they have no uid of their own for kill_sandbox_processes to sweep.
    attack, results, raw = autograder.submit(_hostile(nbformat.read(SOLUTION, as_version=4)), docker="caps")
    assert attack.returncode == 0 and results["score"] == get_exercise(EXERCISE).max_score, attack.stderr[-2000:]
    time.sleep(4)
    assert (autograder.root / "results" / "results.json").read_bytes() == raw
    assert not _files_with(MARKER, autograder.root)


@needs_bwrap
@needs_root
def test_gradescope_refusal_under_dockers_seccomp_names_its_own_options(autograder):
    """With Docker's default seccomp profile (no new namespaces without CAP_SYS_ADMIN) no sandbox can start:
    the refusal the learner sees names this command's options (--isolation none), not the CLI's."""
    run, results, _ = autograder.submit(nbformat.read(SOLUTION, as_version=4), docker="seccomp")
    assert run.returncode == REFUSED_EXIT, run.stdout[-2000:] + run.stderr[-2000:]
    assert results["score"] == 0 and results["tests"] == []
    assert "--isolation none" in results["output"] and "seccomp" in results["output"], results["output"]
    assert "--no-sandbox" not in results["output"] and "make grader-deps" not in results["output"]


@needs_bwrap
@needs_root
def test_gradescope_writes_results_even_when_the_grader_cannot_start(autograder):
    broken = autograder.base / "broken-python"
    broken.mkdir(exist_ok=True)
    script = autograder.root / "run_autograder"
    text = script.read_text()
    try:  # the venv's python missing, as after a failed setup.sh
        script.write_text(text.replace("/autograder/venv/bin/python", str(broken / "python")))
        run, results, _ = autograder.submit(nbformat.read(SOLUTION, as_version=4))
    finally:
        script.write_text(text)
    assert run.returncode != 0
    _check_format(results)
    assert results["score"] == 0 and "could not run" in results["output"]


@needs_root
def test_every_process_of_the_sandbox_uids_is_killed(tmp_path):
    uid = sandbox_uids(os.getpid())[-1]
    # A shell that leaves a loop in a session of its own (setsid), both named MARKER ($0), as that uid.
    loop = "while :; do sleep 1; done"
    child = subprocess.Popen(["/bin/sh", "-c", f'setsid /bin/sh -c "{loop}" "$0" & {loop}', MARKER], user=uid,
                             group=uid, extra_groups=[], start_new_session=True, cwd="/", env={"PATH": "/usr/bin:/bin"})
    try:
        # The child and the loop in a session of its own; each shell forks briefly for every `sleep` (and the
        # child for `&`), so more are seen at some instants: wait for an instant with exactly these two.
        deadline = time.monotonic() + 60
        while len(_processes_with(MARKER)) != 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(_processes_with(MARKER)) >= 2
        # One uid of this process's block (the whole block may hold other tests' warm sandboxes).
        seen = kill_sandbox_processes(range(uid, uid + 1))
        child.wait(timeout=30)
        assert child.pid in seen and len(seen) >= 2
        assert not _processes_with(MARKER)
        assert kill_sandbox_processes(range(uid, uid + 1)) == []  # a second sweep finds nothing
    finally:
        child.kill()
        child.wait()


# --- GitHub Classroom ---------------------------------------------------------------------------------------
_EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


@dataclass
class Job:
    """What a run of the workflow's job did."""

    outputs: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    failed: str | None = None
    points: tuple[float, float] | None = None  # (total, max) as the reporter computes them


def _substitute(text: str, job: Job, runner_temp: Path) -> str:
    def value(match: re.Match) -> str:
        expression = match.group(1)
        if expression == "runner.temp":
            return str(runner_temp)
        step = re.fullmatch(r"steps\.([A-Za-z0-9_-]+)\.outputs\.result", expression)
        if step:
            return job.outputs.get(step.group(1), "")  # as Actions: an unknown step's output is empty
        raise AssertionError(f"the test cannot evaluate ${{{{ {expression} }}}}")

    return _EXPRESSION.sub(value, text)


def command_grader(inputs: dict, cwd: Path, path: str) -> str:
    """The ``result`` output of classroom-resources/autograding-command-grader@v1 (its src/main.js): the
    command runs with ``/bin/sh`` in a five-variable environment; exit 0 earns ``max-score``, anything else 0;
    the output is the base64 of the result's JSON."""
    env = {"PATH": path, "FORCE_COLOR": "true", "DOTNET_CLI_HOME": "/tmp", "DOTNET_NOLOGO": "true",
           "HOME": os.environ.get("HOME", "/root")}
    timeout = float(inputs.get("timeout") or 10) * 60
    max_score = int(inputs.get("max-score") or 0)
    try:
        done = subprocess.run(["/bin/sh", "-c", inputs["command"]], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout)
        status, message = ("pass", done.stdout) if done.returncode == 0 else ("fail", "failed with exit code 1")
    except subprocess.TimeoutExpired:
        status, message = "error", "Command timed out"
    result = {"version": 1, "status": status, "max_score": max_score,
              "tests": [{"name": inputs["test-name"], "status": status,
                         "score": max_score if status == "pass" else 0, "message": message,
                         "test_code": inputs["command"], "filename": "", "line_no": 0, "duration": 0}]}
    return base64.b64encode(json.dumps(result).encode()).decode()


def reporter_points(runners: str, env: dict[str, str]) -> tuple[float, float]:
    """The points classroom-resources/autograding-grading-reporter@v1 reports: its src/main.js reads each
    runner's result from ``process.env[`${runner.trim().toUpperCase()}_RESULTS`]`` (so the variable is named
    from the id as written, hyphens kept) and decodes it from base64; src/notify-classroom.js adds the
    tests' scores of every runner with a max_score, and the max_scores."""
    total = maximum = 0.0
    for runner in filter(None, re.split(r"[\s,]", runners)):
        name = f"{runner.strip().upper()}_RESULTS"
        if not env.get(name):
            raise AssertionError(f"the reporter reads {name}, which the workflow does not set (or sets empty)")
        results = json.loads(base64.b64decode(env[name]).decode("utf-8"))
        if not results.get("max_score"):
            continue
        maximum += results["max_score"]
        total += sum(test["score"] for test in results["tests"])
    return total, maximum


def _installs(script: str) -> bool:
    commands = [line.strip() for line in script.splitlines() if line.strip() and not line.strip().startswith("#")]
    return bool(commands) and all(re.search(r"\bapt-get\b|\bpip install\b", line) for line in commands)


def run_workflow(checkout: Path, runner_temp: Path, path_prefix: str = "") -> Job:
    """Run the workflow's one job in ``checkout`` as the runner would (see the module docstring)."""
    import yaml

    workflow = yaml.safe_load(WORKFLOW.read_text())
    (job_spec,) = workflow["jobs"].values()
    job = Job()
    path = f"{path_prefix}{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
    for step in job_spec["steps"]:
        uses, name = step.get("uses", ""), step.get("name", step.get("uses"))
        if uses.startswith("actions/checkout@"):
            continue  # the checkout is the temporary folder
        if uses.startswith("actions/setup-python@"):
            continue  # PATH's python is this test's interpreter, with the course package
        if "run" in step:
            if _installs(step["run"]):
                job.skipped.append(name)  # downloads: this environment has what it installs
                continue
            env = {"PATH": path, "HOME": os.environ.get("HOME", "/root"), "RUNNER_TEMP": str(runner_temp),
                   "OMP_NUM_THREADS": "1", **{k: str(v) for k, v in step.get("env", {}).items()}}
            done = subprocess.run(["bash", "-e", "-c", _substitute(step["run"], job, runner_temp)], cwd=checkout,
                                  env=env, capture_output=True, text=True, timeout=900)
            job.log.append(done.stdout + done.stderr)
            if done.returncode != 0:
                job.failed = name  # later steps do not run (no `if: always()` in the workflow)
                return job
        elif uses.startswith("classroom-resources/autograding-command-grader@"):
            inputs = {k: _substitute(str(v), job, runner_temp) for k, v in step["with"].items()}
            job.outputs[step["id"]] = command_grader(inputs, checkout, path)
        elif uses.startswith("classroom-resources/autograding-grading-reporter@"):
            env = {k: _substitute(str(v), job, runner_temp) for k, v in step["env"].items()}
            job.points = reporter_points(step["with"]["runners"], env)
        else:
            raise AssertionError(f"a step the test cannot run: {uses or name}")
    return job


def _checkout(tmp_path: Path, notebook: nbformat.NotebookNode) -> tuple[Path, Path]:
    checkout, runner_temp = tmp_path / "checkout", tmp_path / "runner-temp"
    (checkout / "exercises").mkdir(parents=True)
    (checkout / ".github" / "workflows").mkdir(parents=True)
    runner_temp.mkdir()
    shutil.copy(WORKFLOW, checkout / ".github" / "workflows" / "classroom.yml")
    nbformat.write(notebook, checkout / "exercises" / NOTEBOOK)
    return checkout, runner_temp


def test_classroom_workflow_names_what_the_reporter_reads():
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the workflow")
    workflow = yaml.safe_load(WORKFLOW.read_text())
    # The reporter's README: the workflow must be named "Autograding Tests", its one job run-autograding-tests.
    assert workflow["name"] == "Autograding Tests" and list(workflow["jobs"]) == ["run-autograding-tests"]
    steps = workflow["jobs"]["run-autograding-tests"]["steps"]
    graders = [s for s in steps if s.get("uses", "").startswith("classroom-resources/autograding-command-grader@")]
    (reporter,) = [s for s in steps if s.get("uses", "").startswith("classroom-resources/autograding-grading-reporter@")]
    exercise = get_exercise(EXERCISE)
    assert [s["with"]["test-name"] for s in graders] == [part.name for part in exercise.parts]
    assert [int(s["with"]["max-score"]) for s in graders] == [part.points for part in exercise.parts]
    runners = reporter["with"]["runners"].split(",")
    assert runners == [s["id"] for s in graders]
    assert reporter["env"] == {f"{r.upper()}_RESULTS": f"${{{{steps.{r}.outputs.result}}}}" for r in runners}
    assert "runs-on" in workflow["jobs"]["run-autograding-tests"]
    text = WORKFLOW.read_text()
    assert "Runners:" in text and "apparmor_restrict_unprivileged_userns" in text


def test_reporter_emulation_misses_underscored_names():
    # The old workflow's names: the reporter finds nothing under them (the emulation is not lenient).
    result = command_grader({"test-name": "t", "command": "true", "max-score": "2"}, Path("/"), "/usr/bin:/bin")
    assert reporter_points("project-qkv", {"PROJECT-QKV_RESULTS": result}) == (2, 2)
    with pytest.raises(AssertionError, match="PROJECT-QKV_RESULTS"):
        reporter_points("project-qkv", {"PROJECT_QKV_RESULTS": result})
    failing = command_grader({"test-name": "t", "command": "false", "max-score": "2"}, Path("/"), "/usr/bin:/bin")
    assert reporter_points("a,b", {"A_RESULTS": result, "B_RESULTS": failing}) == (2, 4)


@needs_bwrap
def test_classroom_workflow_reports_the_points_of_each_part(tmp_path):
    pytest.importorskip("yaml", reason="PyYAML reads the workflow")
    exercise = get_exercise(EXERCISE)
    mutant = next(m for m in MUTANTS if m.name == "matrix_softmax_over_queries")
    for name, notebook in (("solution", nbformat.read(SOLUTION, as_version=4)), ("mutant", apply(mutant))):
        checkout, runner_temp = _checkout(tmp_path / name, notebook)
        job = run_workflow(checkout, runner_temp)
        assert job.failed is None, "\n".join(job.log)
        assert job.skipped == ["Install the grader"]
        graded = json.loads((runner_temp / "grades.json").read_text())["notebooks"][0]
        # Classroom shows the grader's all-or-nothing score: the reporter's total is the grader's.
        assert job.points == (graded["score"], exercise.max_score), "\n".join(job.log)
        if name == "solution":
            assert graded["score"] == exercise.max_score
        else:  # the mutant's part (and any part built on it) loses its points, the others keep theirs
            lost = {part["name"] for part in graded["parts"] if part["status"] != "passed"}
            assert mutant.part in lost and len(lost) < len(exercise.parts) and 0 < job.points[0]
        # The grades live outside the checkout: a grades.json committed by the learner is never read.
        assert not (checkout / "grades.json").exists()


@needs_bwrap
def test_classroom_workflow_fails_loudly_where_bubblewrap_cannot_start(tmp_path):
    pytest.importorskip("yaml", reason="PyYAML reads the workflow")
    fake = tmp_path / "no-namespaces"
    fake.mkdir()
    (fake / "bwrap").write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    (fake / "bwrap").chmod(0o755)
    checkout, runner_temp = _checkout(tmp_path, _hostile(nbformat.read(SOLUTION, as_version=4)))
    job = run_workflow(checkout, runner_temp, path_prefix=f"{fake}:")
    assert job.failed == "Grade the notebook once"
    assert job.points is None  # the reporter never ran: no points at all, not unisolated ones
    assert "::error::" in job.log[-1] and "apparmor_restrict_unprivileged_userns" in job.log[-1]
    assert "setting up uid map: Permission denied" in job.log[-1]
    time.sleep(3)  # a forked process of the attack would write within a second
    assert not _files_with(MARKER, tmp_path)
