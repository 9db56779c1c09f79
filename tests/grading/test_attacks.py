"""Hostile submissions against the isolated grader (issue 18): each is a notebook this test generates.

One grader run (the CLI, ``--jobs 2``, a short ``--timeout``) grades honest classmates (copies of the ex02
solution: full marks) next to attackers (the learner notebooks, whose stubs earn nothing, with attack code
in a graded cell, plus files that are not notebooks). Every attack, whether it fails or "succeeds", is
judged by what it must not change:

- the attacker earns nothing it did not solve (every attacker here solved nothing: 0 points);
- honest classmates graded in the same run keep their full marks;
- ``grades.csv`` and ``grades.json`` agree with the printed table after the run, and a few seconds later;
- no process of the run survives it (sandbox uids, job folders), and no file outside the sandboxes changed
  (submissions hashed before and after; the attack payload's marker appears in no file of the package,
  the environment's site-packages, the solutions, the grades or the honeypot "home");
- no secret reaches the report: an attack that reads something it must not see raises ``LEAK: ...``,
  which would show in the part's message; the honeypot's, a classmate's and the grader's environment's
  secrets must appear nowhere in the output;
- the run ends within a bound computed from the per-notebook limit.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from attention_course.grading.isolation import Limits, bwrap_path
from attention_course.grading.launcher import sandbox_uids
from attention_course.grading.sandbox import DEFAULT_OUTPUT_LIMIT, STARTUP_TIMEOUT, notebook_budget
from tests.grading.mutants import graded_cell

pytestmark = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (make grader-deps) is not installed")

ROOT = Path(__file__).resolve().parents[2]
SOLUTION = ROOT / "exercises" / "solutions" / "ex02_hard_and_soft_attention.ipynb"
LEARNER = ROOT / "exercises" / "ex02_hard_and_soft_attention.ipynb"
LEARNER_EX10 = ROOT / "exercises" / "ex10_decoder_and_transformer.ipynb"
PACKAGE = ROOT / "src" / "attention_course"
TIMEOUT = 5  # seconds per cell or part
JOBS = 2
HONEST = 3
MARKER = "G_ATTACK_PAYLOAD_" + uuid.uuid4().hex[:12]  # what attacks try to write outside their sandbox
SECRETS = {
    "home": "HOME_SECRET_" + uuid.uuid4().hex,
    "classmate": "CLASSMATE_SECRET_" + uuid.uuid4().hex,
    "environment": "GRADER_ENV_SECRET_" + uuid.uuid4().hex,
}

# Attack code runs at the top of the graded cell of the first part. {paths} are filled in by the fixture.
COMMON = """
import glob, json, os, signal, socket, struct, sys, time
SUB, OUT, HOME, SOL, PORT = {sub!r}, {out!r}, {home!r}, {sol!r}, {port!r}
PKG = {pkg_reversed!r}[::-1]  # reversed: the package's name in a string would break the library rule
MARKER = {marker!r}

def channel_fds():
    found = []
    for fd in range(3, 64):
        try:
            import stat
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                found.append(fd)
        except OSError:
            pass
    return found

def frame(payload):
    return struct.pack(">I", len(payload)) + payload
"""

ATTACKS: dict[str, str] = {
    # --- writing where later imports or runs read --------------------------------------------------------
    "appends_to_the_exercise_module": """
for target in [os.path.join(PKG, "grading", "exercises", "ex02.py"), os.path.join(PKG, "grading", "judge.py")]:
    try:
        with open(target, "a") as f:
            f.write("\\n# " + MARKER + "\\n")
        raise RuntimeError("LEAK: appended to " + target)
    except OSError:
        pass
""",
    "plants_sitecustomize_and_pth": """
for folder in sys.path + [PKG]:
    for name in ("sitecustomize.py", "usercustomize.py", "zz_attack.pth"):
        try:
            with open(os.path.join(folder, name), "w") as f:
                f.write("# " + MARKER + "\\n")
            raise RuntimeError("LEAK: planted " + os.path.join(folder, name))
        except OSError:
            pass
""",
    "plants_ipython_startup_file": """
for home in [HOME, os.path.expanduser("~")]:
    folder = os.path.join(home, ".ipython", "profile_default", "startup")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "00-attack.py"), "w") as f:  # the sandbox's own /tmp at most
            f.write("# " + MARKER + "\\n")
    except OSError:
        pass
""",
    "poisons_pycache": """
folder = os.path.join(PKG, "grading", "exercises", "__pycache__")
try:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "ex02.cpython-311.pyc"), "wb") as f:
        f.write(MARKER.encode())
    raise RuntimeError("LEAK: wrote a .pyc into the package")
except OSError:
    pass
""",
    # --- other submissions, solutions, grades, the instructor's files -----------------------------------
    "finds_submissions_through_proc": """
for path in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        text = open(path, "rb").read().decode(errors="replace")
    except OSError:
        continue
    if ".ipynb" in text or SUB in text:
        raise RuntimeError("LEAK: saw the grader's command line " + text[:200])
if os.path.exists(SUB):
    raise RuntimeError("LEAK: the submissions folder is visible")
""",
    "overwrites_classmates": """
for path in glob.glob(os.path.join(SUB, "*.ipynb")) + glob.glob(os.path.join(SUB, "**", "*.ipynb")):
    try:
        with open(path, "w") as f:
            f.write(MARKER)
        raise RuntimeError("LEAK: overwrote " + path)
    except OSError:
        pass
""",
    "reads_classmates_and_home": """
for path in glob.glob(os.path.join(SUB, "*")) + [os.path.join(HOME, "secret.txt"), "/etc/passwd", "/etc/shadow"]:
    try:
        raise RuntimeError("LEAK: " + open(path).read()[:300])
    except OSError:
        pass
""",
    "runs_the_solutions": """
import attention_course
root = os.path.dirname(os.path.dirname(os.path.dirname(attention_course.__file__)))
for folder in [SOL, os.path.join(root, "exercises", "solutions")]:
    if os.path.isdir(folder):
        raise RuntimeError("LEAK: solutions at " + folder + ": " + str(os.listdir(folder))[:200])
""",
    "setsid_daemon_rewrites_the_grades": """
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(3)
        for name in ("grades.json", "grades.csv"):
            try:
                with open(os.path.join(OUT, name), "w") as f:
                    f.write(MARKER)
            except OSError:
                pass
        os._exit(0)
    os._exit(0)
time.sleep(0.2)
""",
    "kills_every_process_it_can_see": """
for path in glob.glob("/proc/[0-9]*"):
    pid = int(os.path.basename(path))
    if pid != os.getpid():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
try:
    os.kill(-1, signal.SIGKILL)
except OSError:
    pass
""",
    "reads_the_grader_environment_and_memory": """
for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/mem"):
    try:
        data = open(path, "rb").read(1 << 20)
    except OSError:
        continue
    if b"GRADER_ENV_SECRET" in data:
        raise RuntimeError("LEAK: " + data.decode(errors="replace")[:300])
if "GRADER_ENV_SECRET" in str(os.environ):
    raise RuntimeError("LEAK: " + str(os.environ)[:300])
import ctypes
libc = ctypes.CDLL(None)
for pid in range(1, 400):
    if libc.ptrace(16, pid, 0, 0) == 0:  # PTRACE_ATTACH
        raise RuntimeError("LEAK: attached to pid " + str(pid))
""",
    "reaches_the_network": """
for address in [("127.0.0.1", PORT), ("1.1.1.1", 53), ("8.8.8.8", 443)]:
    try:
        socket.create_connection(address, timeout=1).close()
        raise RuntimeError("LEAK: connected to " + str(address))
    except OSError:
        pass
""",
    "gains_privileges": """
for attempt in (lambda: os.setuid(0), lambda: os.setgid(0), lambda: os.chroot("/"),
                lambda: open("/etc/shadow").read()):
    try:
        attempt()
        raise RuntimeError("LEAK: a privileged call succeeded")
    except OSError:
        pass
""",
    # --- attacks on the channel to the grader -----------------------------------------------------------
    "sends_deeply_nested_json": """
for fd in channel_fds():
    try:
        os.write(fd, frame(b"[" * 100_000 + b"]" * 100_000))
    except OSError:
        pass
""",
    "floods_the_channel": """
payload = frame(json.dumps({"step": "cell", "cell": 0, "part": "hard_attention_weights"}).encode())
for fd in channel_fds():
    try:
        for _ in range(200_000):
            os.write(fd, payload)
    except OSError:
        pass
""",
    "reannounces_its_step_forever": """
for _ in range(600):
    for fd in channel_fds():
        try:
            os.write(fd, frame(json.dumps({"step": "part", "part": "hard_attention_weights"}).encode()))
        except OSError:
            pass
    time.sleep(0.5)
""",
    "announces_a_giant_frame": """
for fd in channel_fds():
    try:
        os.write(fd, struct.pack(">I", 0xFFFFFFF0) + b"x" * 65536)
    except OSError:
        pass
""",
    "forges_done": """
for fd in channel_fds():
    try:
        os.write(fd, frame(b'{"step": "done"}'))
    except OSError:
        pass
""",
    "closes_every_descriptor": """
os.closerange(3, 4096)
""",
    # --- resources --------------------------------------------------------------------------------------
    "memory_bomb_3_gb": """
import torch
try:
    hoard = torch.ones(3 * 1024**3 // 4)
    raise RuntimeError("LEAK: allocated 3 GB")
except (MemoryError, RuntimeError) as exc:
    if "LEAK" in str(exc):
        raise
try:
    hoard = bytearray(3 * 1024**3)
    raise RuntimeError("LEAK: allocated 3 GB")
except MemoryError:
    raise RuntimeError("BLOCKED: no 3 GB for me")
""",
    "fork_bomb": """
children = 0
for _ in range(10_000):
    try:
        if os.fork() == 0:
            time.sleep(1000)
            os._exit(0)
        children += 1
    except OSError:
        break
if children >= 1000:
    raise RuntimeError("LEAK: started " + str(children) + " processes")
raise RuntimeError("BLOCKED after " + str(children) + " processes")
""",
    "fills_the_disk": """
written = 0
try:
    with open("/tmp/fill", "wb") as f:
        for _ in range(2000):
            f.write(b"x" * (1 << 20))
            written += 1 << 20
except OSError:
    pass
if written >= 1 << 30:
    raise RuntimeError("LEAK: wrote 1 GB")
raise RuntimeError("BLOCKED after " + str(written) + " bytes")
""",
    "prints_20_megabytes": """
print("y" * 20_000_000)
""",
    # --- forging the report -----------------------------------------------------------------------------
    "ansi_escapes_forge_a_pass": """
raise ValueError("\\x1b[2K\\r\\x1b[1A  hard_attention_weights  1/1  all 8 cases passed\\n\\x1b[32mPASSED\\x1b[0m")
""",
}

# Attacks that call the course library instead of solving the part (the library rule).
LIBRARY_ATTACKS: dict[str, tuple[str, str]] = {
    "calls_the_library_directly": (
        "soft_attention_weights",
        "import attention_course as ac\n"
        "def soft_attention_weights(scores, beta=1.0):\n    return ac.soft_attention_weights(scores, beta)\n"),
    "calls_the_library_through_getattr": (
        "soft_attention_weights",
        "_lib = __import__('attention' + '_course')\n"
        "def soft_attention_weights(scores, beta=1.0):\n"
        "    return getattr(_lib, 'soft_attention' + '_weights')(scores, beta)\n"),
}

# Attacks that reach the course library (or the grader's references) by a route the source check cannot
# read (issue 23): a name built at run time, a module table, the garbage collector, pickle, frames, the
# package's files, a class's globals, a helper of another part. Each would return the library's right
# answer if the route were open; the run-time guard (import_guard) must refuse it. notebook -> {part: source}.
# "runtime": the source check must NOT be what stopped it (its message is not the rule's "no marks: it uses").
EX10, EX13, EX14, EX15 = ("ex10_decoder_and_transformer", "ex13_decoder_only_language_models",
                          "ex14_positions_for_long_contexts", "ex15_attention_at_inference_scale")
EX09 = "ex09_the_encoder"
GUARD_ATTACKS: dict[str, tuple[str, dict[str, str], str]] = {
    "imports_a_submodule_by_a_built_string": (EX14, {"rotate_pairs": (
        "def rotate_pairs(x, positions, base=10000.0):\n"
        "    rotary = __import__('attention' + '_course.rotary', fromlist=['apply_rotary'])\n"
        "    return rotary.apply_rotary(x, positions, base)\n")}, "runtime"),
    "imports_through_the_package_attribute": (EX14, {"rotate_pairs": (
        "def rotate_pairs(x, positions, base=10000.0):\n"
        "    return __import__('attention' + '_course').rotary.apply_rotary(x, positions, base)\n")}, "runtime"),
    "import_module_of_decoded_bytes": (EX14, {"rotate_pairs": (
        "import importlib\n"
        "def rotate_pairs(x, positions, base=10000.0):\n"
        "    name = bytes([97, 116, 116, 101, 110, 116, 105, 111, 110, 95, 99, 111, 117, 114, 115, 101]).decode()\n"
        "    return importlib.import_module(name + '.rotary').apply_rotary(x, positions, base)\n")}, "runtime"),
    "import_module_of_a_bytes_constant": (EX14, {"rotate_pairs": (
        "import importlib\n"
        "def rotate_pairs(x, positions, base=10000.0):\n"
        "    module = importlib.import_module(b'attention_course.rotary'.decode())\n"
        "    return module.apply_rotary(x, positions, base)\n")}, "source"),
    "scans_sys_modules": (EX15, {"grouped_query_attention": (
        "import sys\n"
        "def grouped_query_attention(query, key, value, mask=None):\n"
        "    module = next(m for k, m in list(sys.modules.items()) if k.endswith('.grouped_query'))\n"
        "    return module.grouped_query_attention(query, key, value, mask=mask)\n")}, "runtime"),
    "scans_gc_objects": (EX15, {"grouped_query_attention": (
        "import gc\n"
        "def grouped_query_attention(query, key, value, mask=None):\n"
        "    found = next(o for o in gc.get_objects() if callable(o) and getattr(o, '__name__', '') ==\n"
        "                 'grouped_query_attention' and str(getattr(o, '__module__', '')).endswith('grouped_query'))\n"
        "    return found(query, key, value, mask=mask)\n")}, "runtime"),
    "reaches_ac_rms_norm_by_a_built_name": (EX13, {"rms_norm": (
        "def rms_norm(x, weight, eps=1e-5):\n"
        "    norm = getattr(__import__('attention' + '_course'), 'RMS' + 'Norm')(x.shape[-1], eps)\n"
        "    norm.weight.data = weight\n"
        "    return norm(x).detach()\n")}, "runtime"),
    # Not the course library but PyTorch's own RMSNorm, taken before the check runs: refused while it runs.
    "captures_torchs_rms_norm_in_a_default": (EX13, {"rms_norm": (
        "def rms_norm(x, weight, eps=1e-5, _norm=getattr(torch.nn.functional, 'rms' + '_norm')):\n"
        "    return _norm(x, (x.shape[-1],), weight, eps)\n")}, "runtime"),
    "unpickles_the_graders_reference": (EX13, {"top_k_filter": (
        "import pickle\n"
        "def top_k_filter(logits, k):\n"
        "    name = ('attention' + '_course.grading.exercises.ex13').encode()\n"
        "    return pickle.loads(b'c' + name + b'\\nreference_top_k\\n.')(logits, k)\n")}, "runtime"),
    "unpickles_a_bytes_constant": (EX13, {"top_k_filter": (
        "import pickle\n"
        "def top_k_filter(logits, k):\n"
        "    return pickle.loads(b'cattention_course.grading.exercises.ex13\\nreference_top_k\\n.')(logits, k)\n")},
        "source"),
    "walks_frames_to_the_exercise": (EX13, {"top_k_filter": (
        "import sys\n"
        "def top_k_filter(logits, k):\n"
        "    frame = sys._getframe(1)\n"
        "    while frame is not None:\n"
        "        for value in list(frame.f_locals.values()):\n"
        "            for candidate in (getattr(value, 'verify', None), getattr(value, 'run', None)):\n"
        "                found = getattr(getattr(candidate, 'verify', candidate), '__globals__', {})\n"
        "                if 'reference_top_k' in found:\n"
        "                    return found['reference_top_k'](logits, k)\n"
        "            if isinstance(value, dict):\n"
        "                for item in value.values():\n"
        "                    run = item[0] if isinstance(item, tuple) else item\n"
        "                    found = getattr(getattr(run, 'run', run), '__globals__', {})\n"
        "                    if 'reference_top_k' in found:\n"
        "                        return found['reference_top_k'](logits, k)\n"
        "        frame = frame.f_back\n"
        "    raise RuntimeError('not found')\n")}, "runtime"),
    "walks_a_traceback_to_the_exercise": (EX13, {"top_k_filter": (
        "def top_k_filter(logits, k):\n"
        "    try:\n"
        "        raise ValueError\n"
        "    except ValueError as exc:\n"
        "        frame = exc.__traceback__.tb_frame\n"
        "    while frame is not None:\n"
        "        for value in list(frame.f_locals.values()):\n"
        "            run = getattr(value, 'run', None)\n"
        "            found = getattr(getattr(run, 'run', run), '__globals__', {})\n"
        "            if 'reference_top_k' in found:\n"
        "                return found['reference_top_k'](logits, k)\n"
        "        frame = frame.f_back\n"
        "    raise RuntimeError('not found')\n")}, "runtime"),
    "walks_the_stack_through_a_library_function": (EX13, {"top_k_filter": (
        "import heapq, traceback\n"
        "def top_k_filter(logits, k):\n"
        "    for frame, _ in heapq.nlargest(1000, traceback.walk_stack(None), key=lambda item: 0):\n"
        "        while frame is not None:\n"
        "            for value in list(frame.f_locals.values()):\n"
        "                run = getattr(value, 'run', None)\n"
        "                found = getattr(getattr(run, 'run', run), '__globals__', {})\n"
        "                if 'reference_top_k' in found:\n"
        "                    return found['reference_top_k'](logits, k)\n"
        "            frame = frame.f_back\n"
        "    raise RuntimeError('not found')\n")}, "runtime"),
    "executes_the_library_file": (EX14, {"rotate_pairs": (
        "import os, sys\n"
        "def rotate_pairs(x, positions, base=10000.0):\n"
        "    folder = os.path.dirname(sys.modules['attention' + '_course'].__file__)\n"
        "    namespace = {}\n"
        "    with open(os.path.join(folder, 'rotary.py')) as source:\n"
        "        exec(source.read(), namespace)\n"
        "    return namespace['apply_rotary'](x, positions, base)\n")}, "runtime"),
    "runs_a_fresh_interpreter": (EX14, {"rotate_pairs": (
        "import subprocess, sys, torch, io\n"
        "def rotate_pairs(x, positions, base=10000.0):\n"
        "    code = ('import sys, io, torch; from ' + 'attention' + '_course.rotary import apply_rotary as f; '\n"
        "            'x, p, b = torch.load(io.BytesIO(sys.stdin.buffer.read())); '\n"
        "            'buf = io.BytesIO(); torch.save(f(x, p, b), buf); sys.stdout.buffer.write(buf.getvalue())')\n"
        "    given = io.BytesIO()\n"
        "    torch.save((x, positions, base), given)\n"
        "    done = subprocess.run([sys.executable, '-c', code], input=given.getvalue(), capture_output=True)\n"
        "    return torch.load(io.BytesIO(done.stdout))\n")}, "runtime"),
    "forks_and_execs_through_posixsubprocess": (EX14, {"rotate_pairs": (
        "import os, sys\n"
        "def rotate_pairs(x, positions, base=10000.0):\n"
        "    fork_exec = sys.modules['subprocess']._posixsubprocess.fork_exec\n"
        "    raise RuntimeError('LEAK: fork_exec is still reachable: ' + repr(fork_exec))\n")}, "runtime"),
    "reaches_a_reference_through_a_class": (EX10, {"greedy_decode": (
        "def greedy_decode(model, src, max_len, bos_id, eos_id, pad_id):\n"
        "    for klass in type(model).__mro__:\n"
        "        for value in vars(klass).values():\n"
        "            found = getattr(value, '__globals__', {}).get('greedy_decode')\n"
        "            if found is not None and found is not greedy_decode:\n"
        "                return found(model, src, max_len, bos_id, eos_id, pad_id=pad_id)\n"
        "    raise RuntimeError('not found')\n")}, "runtime"),
    "borrows_a_helper_of_an_allowed_part": (EX10, {
        "decoder_layer_forward": (
            "def decoder_layer_forward(layer, y, memory, self_mask=None, memory_mask=None):\n"
            "    raise NotImplementedError\n\n"
            "def lower_triangle(length):\n"
            "    return ac.causal_mask(length)\n"),
        "decoder_masks": (
            "def decoder_masks(src, decoder_input, pad_id):\n"
            "    self_mask = lower_triangle(decoder_input.size(1))\n"
            "    return self_mask, (src != pad_id)[:, None, None, :]\n")}, "runtime"),
    # Issue 42: ex09's encoder_layer may use ac.PositionwiseFeedForward, its feed_forward may not; a class
    # was never gated per part, so a name the source check cannot read reached it from feed_forward.
    "uses_a_class_another_part_may_use": (EX09, {"feed_forward": (
        "def feed_forward(x, W1, b1, W2, b2):\n"
        "    library = globals()['a' + 'c']\n"
        "    block = getattr(library, 'Positionwise' + 'FeedForward')(W1.shape[0], W1.shape[1])\n"
        "    with torch.no_grad():\n"
        "        block.linear1.weight.copy_(W1.T)\n"
        "        block.linear1.bias.copy_(b1)\n"
        "        block.linear2.weight.copy_(W2.T)\n"
        "        block.linear2.bias.copy_(b2)\n"
        "    return block.eval()(x).detach()\n")}, "runtime"),
    "hides_the_call_in_a_cell_magic": (EX14, {"rotate_pairs": (
        "%%time\n"
        "import attention_course as ac\n"
        "def rotate_pairs(x, positions, base=10000.0):\n"
        "    return ac.apply_rotary(x, positions, base)\n")}, "source"),
}

# Files that are not notebooks, under names that say they are.
FILE_ATTACKS = ["fifo", "symlink_to_dev_zero", "symlink_to_etc_passwd", "oversized", "deeply_nested_json"]


@dataclass
class Run:
    results: dict[str, dict]
    stdout: str
    stderr: str
    seconds: float
    bound: float
    grades_json: bytes
    grades_csv: bytes
    grades_later: tuple[bytes, bytes]
    survivors: list[str]
    leftover_dirs: list[str]
    submissions_before: dict[str, str]
    submissions_after: dict[str, str]
    marker_files: list[str]
    connections: list[str]


def _hash_tree(folder: Path) -> dict[str, str]:
    hashes = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            hashes[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


def _files_with(marker: str, folders: list[Path]) -> list[str]:
    found = []
    for folder in folders:
        for path in folder.rglob("*"):
            try:
                if path.is_file() and not path.is_symlink() and path.stat().st_size < 50_000_000 \
                        and marker.encode() in path.read_bytes():
                    found.append(str(path))
            except OSError:
                pass
    return found


def _processes_of(uids: range) -> list[str]:
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Uid:") and int(line.split()[1]) in uids:
                found.append(f"{status.parent.name}: {text.splitlines()[0]}")
    return found


def _attack_notebook(code: str, paths: dict) -> nbformat.NotebookNode:
    nb = nbformat.read(LEARNER, as_version=4)
    cell = graded_cell(nb, "hard_attention_weights")
    cell.source = COMMON.format(**paths) + code + "\n" + cell.source
    return nb


@pytest.fixture(scope="module")
def attacked(tmp_path_factory) -> Run:
    base = tmp_path_factory.mktemp("attacks")
    sub, out, home = base / "submissions", base / "grades", base / "home"
    for folder in (sub, out, home):
        folder.mkdir()
    (home / "secret.txt").write_text(SECRETS["home"])
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.5)
    connections: list[str] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                connection, address = server.accept()
                connections.append(str(address))
                connection.close()
            except OSError:
                pass

    threading.Thread(target=accept, daemon=True).start()
    paths = {"sub": str(sub), "out": str(out), "home": str(home), "sol": str(SOLUTION.parent), "pkg_reversed": str(PACKAGE)[::-1],
             "port": server.getsockname()[1], "marker": MARKER}

    for number in range(HONEST):
        nb = nbformat.read(SOLUTION, as_version=4)
        nb.cells.append(nbformat.v4.new_markdown_cell(f"my notes: {SECRETS['classmate']}"))
        nbformat.write(nb, sub / f"honest_{number}.ipynb")
    for name, code in ATTACKS.items():
        nbformat.write(_attack_notebook(code, paths), sub / f"attack_{name}.ipynb")
    for name, (part, source) in LIBRARY_ATTACKS.items():
        nb = nbformat.read(LEARNER, as_version=4)
        graded_cell(nb, part).source = source
        nbformat.write(nb, sub / f"attack_{name}.ipynb")
    for name, (notebook, sources, _) in GUARD_ATTACKS.items():
        nb = nbformat.read(LEARNER.parent / f"{notebook}.ipynb", as_version=4)
        for part, source in sources.items():
            graded_cell(nb, part).source = source
        nbformat.write(nb, sub / f"attack_{name}.ipynb")
    # ex10: the decoder layer stolen from the reference the checker used to send along with the case.
    nb = nbformat.read(LEARNER_EX10, as_version=4)
    graded_cell(nb, "decoder_layer_forward").source = (
        "import sys\n"
        "def decoder_layer_forward(sublayers, y, memory, self_mask=None, memory_mask=None, **kwargs):\n"
        "    frame = sys._getframe(1)\n"
        "    while frame is not None and 'case' not in frame.f_locals:\n"
        "        frame = frame.f_back\n"
        "    reference = frame.f_locals['case'].data['reference']\n"
        "    return reference(y, memory, tgt_mask=None if self_mask is None else ~self_mask,\n"
        "                     memory_key_padding_mask=None if memory_mask is None else ~memory_mask[:, 0, 0])\n")
    nbformat.write(nb, sub / "attack_steals_the_reference_ex10.ipynb")
    os.mkfifo(sub / "attack_fifo.ipynb")
    (sub / "attack_symlink_to_dev_zero.ipynb").symlink_to("/dev/zero")
    (sub / "attack_symlink_to_etc_passwd.ipynb").symlink_to("/etc/passwd")
    with open(sub / "attack_oversized.ipynb", "wb") as f:
        f.truncate(21_000_000)
    (sub / "attack_deeply_nested_json.ipynb").write_text("[" * 200_000 + "]" * 200_000)

    before = _hash_tree(sub)
    env = {**os.environ, "GRADER_SECRET_TOKEN": SECRETS["environment"], "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "attention_course.grading", str(sub), "--json", str(out / "grades.json"),
               "--csv", str(out / "grades.csv"), "--jobs", str(JOBS), "--timeout", str(TIMEOUT), "--seed", "0"]
    started = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=base)
    stdout, stderr = proc.communicate(timeout=900)
    seconds = time.monotonic() - started
    assert proc.returncode == 0, stdout.decode()[-3000:] + stderr.decode()[-3000:]
    grades_json, grades_csv = (out / "grades.json").read_bytes(), (out / "grades.csv").read_bytes()
    time.sleep(4)  # the daemons' moment
    stop.set()
    server.close()
    uids = sandbox_uids(proc.pid)
    results = {Path(entry["path"]).name: entry for entry in json.loads(grades_json)["notebooks"]}
    notebooks = len(results)
    per_notebook = STARTUP_TIMEOUT + notebook_budget(TIMEOUT, 5, 5) + 10
    return Run(
        results=results, stdout=stdout.decode(errors="replace"), stderr=stderr.decode(errors="replace"),
        seconds=seconds, bound=per_notebook * (notebooks / JOBS + 1),
        grades_json=grades_json, grades_csv=grades_csv,
        grades_later=((out / "grades.json").read_bytes(), (out / "grades.csv").read_bytes()),
        survivors=_processes_of(uids),
        leftover_dirs=[str(p) for p in Path("/tmp").glob(f"attention-course-grading-{proc.pid}-*")],
        submissions_before=before, submissions_after=_hash_tree(sub),
        marker_files=_files_with(MARKER, [PACKAGE, Path(sys.prefix) / "lib", SOLUTION.parent, out, home]),
        connections=connections,
    )


def _check_the_run(run: Run) -> None:
    """What every attack must leave intact: classmates, grades, machine, files, time, secrets."""
    for number in range(HONEST):
        entry = run.results[f"honest_{number}.ipynb"]
        assert entry["score"] == entry["max_score"] == 8, entry
    # The grades files agree with the printed table, and still do a few seconds later.
    assert run.grades_later == (run.grades_json, run.grades_csv)
    rows = {Path(row["path"]).name: row for row in csv.DictReader(io.StringIO(run.grades_csv.decode()))}
    table = run.stdout.splitlines()
    for name, entry in run.results.items():
        assert float(rows[name]["score"]) == entry["score"]
        shown = f"{entry['score']:g}/{entry['max_score']}"
        assert any(line.startswith(entry["path"]) and shown in line for line in table), (name, shown)
    assert not run.survivors, run.survivors
    assert not run.leftover_dirs, run.leftover_dirs
    assert run.submissions_after == run.submissions_before
    assert not run.marker_files, run.marker_files
    assert not run.connections, run.connections
    assert run.seconds < run.bound, (run.seconds, run.bound)
    everything = run.stdout + run.stderr + run.grades_json.decode() + run.grades_csv.decode()
    assert "LEAK" not in everything
    for secret in SECRETS.values():
        assert secret not in everything
    assert "\x1b" not in everything
    assert "Traceback" not in everything


def _attacker(run: Run, name: str) -> dict:
    entry = run.results[name]
    assert entry["score"] == 0, entry
    assert all(part["score"] == 0 for part in entry["parts"]), entry
    return entry


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_code_attack_earns_nothing_and_harms_no_one(attacked, attack):
    _check_the_run(attacked)
    entry = _attacker(attacked, f"attack_{attack}.ipynb")
    assert entry["sha256"] and len(entry["sha256"]) == 64


@pytest.mark.parametrize("attack", list(LIBRARY_ATTACKS))
def test_calling_the_course_library_earns_nothing(attacked, attack):
    _check_the_run(attacked)
    entry = _attacker(attacked, f"attack_{attack}.ipynb")
    part = next(p for p in entry["parts"] if p["name"] == "soft_attention_weights")
    assert "does not allow" in part["message"] or "not available in ex02" in part["message"], part


def test_the_reference_does_not_travel_with_the_case(attacked):
    _check_the_run(attacked)
    entry = _attacker(attacked, "attack_steals_the_reference_ex10.ipynb")
    part = next(p for p in entry["parts"] if p["name"] == "decoder_layer_forward")
    # The reference is not in the case (KeyError), and the frames that lead to the case are refused first.
    assert "KeyError" in part["message"] or "may not inspect frames" in part["message"], part


@pytest.mark.parametrize("attack", list(GUARD_ATTACKS))
def test_no_route_to_the_library_earns_marks(attacked, attack):
    """Issue 23: every route to a library module or a reference the part may not use fails at run time,
    whatever string or object reaches it; a source-level disguise the rule reads fails with its message."""
    _check_the_run(attacked)
    entry = _attacker(attacked, f"attack_{attack}.ipynb")
    _, sources, layer = GUARD_ATTACKS[attack]
    attacked_part = list(sources)[-1]
    message = next(part["message"] for part in entry["parts"] if part["name"] == attacked_part)
    if layer == "runtime":
        assert "no marks: it uses" not in message, message  # the run-time guard stopped it, not the source check
        assert "NotImplementedError" not in message and "not attempted" not in message, message
    else:
        assert "no marks: it uses" in message, message


@pytest.mark.parametrize("attack", FILE_ATTACKS)
def test_a_file_that_is_not_a_notebook_is_refused_without_quoting_it(attacked, attack):
    _check_the_run(attacked)
    entry = _attacker(attacked, f"attack_{attack}.ipynb")
    assert entry["message"], entry
    assert "root:" not in entry["message"]
    assert entry["sha256"] is None or attack in ("deeply_nested_json",)


def test_resource_attacks_are_stopped_by_the_limits(attacked):
    parts = {name: {p["name"]: p for p in attacked.results[f"attack_{name}.ipynb"]["parts"]}
             for name in ("prints_20_megabytes", "reannounces_its_step_forever", "floods_the_channel",
                          "sends_deeply_nested_json", "forges_done")}
    assert "printed more than" in parts["prints_20_megabytes"]["hard_attention_weights"]["message"]
    for name in ("reannounces_its_step_forever", "floods_the_channel", "sends_deeply_nested_json", "forges_done"):
        assert "protocol" in parts[name]["hard_attention_weights"]["message"], (name, parts[name])
    limited = {name: attacked.results[f"attack_{name}.ipynb"]["parts"][0]["message"]
               for name in ("memory_bomb_3_gb", "fork_bomb", "fills_the_disk")}
    assert "BLOCKED: no 3 GB" in limited["memory_bomb_3_gb"], limited
    # What matters is that a limit stopped each attack, not how far it got first: on a loaded machine the
    # time limit can stop the fork bomb before RLIMIT_NPROC does, and either stop is a pass.
    for name, limit in (("fork_bomb", Limits().processes - 1), ("fills_the_disk", DEFAULT_OUTPUT_LIMIT + 1)):
        message = limited[name]
        assert "LEAK" not in message, (name, message)
        if "BLOCKED after " in message:  # RLIMIT_NPROC (the worker is not root) or RLIMIT_FSIZE bound
            assert int(message.split("BLOCKED after ")[1].split()[0]) <= limit, (name, message)
        else:
            assert "within the time limit" in message, (name, message)
    # Re-announcing cannot stretch the notebook: it is stopped at its first repeat, not after its loop.
    assert attacked.results["attack_reannounces_its_step_forever.ipynb"]["seconds"] < 3 * TIMEOUT + STARTUP_TIMEOUT


def test_ansi_escapes_cannot_forge_a_line_of_the_report(attacked):
    entry = attacked.results["attack_ansi_escapes_forge_a_pass.ipynb"]
    message = next(p for p in entry["parts"] if p["name"] == "hard_attention_weights")["message"]
    assert "\x1b" not in message and "\n" not in message and "\r" not in message
    assert not any(line.startswith("  hard_attention_weights  1/1  all 8 cases passed")
                   for line in attacked.stdout.splitlines())


def test_without_bubblewrap_the_grader_refuses_and_names_no_sandbox(tmp_path):
    nb = nbformat.read(SOLUTION, as_version=4)
    nbformat.write(nb, tmp_path / "ex02.ipynb")
    env = {**os.environ, "PATH": str(tmp_path / "empty")}
    code = ("import attention_course.grading.isolation as iso; iso.bwrap_path = lambda: None; "
            "from attention_course.grading.__main__ import main; raise SystemExit(main())")
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ex02.ipynb")], capture_output=True,
                         text=True, env=env, timeout=300)
    assert run.returncode == 3, run.stdout + run.stderr
    assert "bubblewrap" in run.stderr and "--no-sandbox" in run.stderr and "make grader-deps" in run.stderr


def test_no_sandbox_runs_unisolated_and_says_so_everywhere(tmp_path):
    nb = nbformat.read(SOLUTION, as_version=4)
    nbformat.write(nb, tmp_path / "ex02.ipynb")
    out = tmp_path / "grades.json"
    run = subprocess.run([sys.executable, "-m", "attention_course.grading", str(tmp_path / "ex02.ipynb"), "--no-sandbox",
                          "--json", str(out), "--timeout", "60"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "WARNING" in run.stderr and "--no-sandbox" in run.stderr
    entry = json.loads(out.read_text())["notebooks"][0]
    assert entry["score"] == 8 and entry["isolated"] is False
    assert entry["message"].startswith("UNISOLATED (--no-sandbox)")
    assert "UNISOLATED (--no-sandbox)" in run.stdout


# --- the pieces, without a grader run -------------------------------------------------------------------
def test_library_rule_reads_the_cell():
    from attention_course.grading.library_rules import library_aliases, library_problem

    def problem(source: str, exercise: str = "ex06", part: str = "multi_head_attention") -> str | None:
        return library_problem(source, exercise, part, library_aliases(["import attention_course as ac", source]))

    assert problem("def f(x):\n    return x @ x.T") is None
    assert "itself" in problem("lib = ac")  # passing the module around is use
    assert "ac.MultiHeadAttention" in problem("def f(x):\n    return ac.MultiHeadAttention(4, 2)(x, x, x)")
    assert "MultiHeadAttention" in problem("from attention_course.multihead import MultiHeadAttention")
    assert "grader's own code" in problem("import attention_course.grading.exercises.ex06 as e")
    assert "itself" in problem("f = getattr(ac, 'Multi' + 'HeadAttention')")
    assert "string" in problem("import importlib\nm = importlib.import_module('attention_course')")
    assert problem("y = ac.causal_mask(4)", "ex10", "greedy_decode") is None
    assert problem("y = ac.causal_mask(4)", "ex10", "decoder_masks") is not None
    assert problem("layer = ac.MultiHeadAttention(8, 2)", "ex09", "encoder_layer") is None
    assert problem("ffn = ac.PositionwiseFeedForward(8, 16)", "ex09", "feed_forward") is not None


def test_channel_refuses_what_is_not_a_small_flat_header():
    from attention_course.grading.channel import FrameReader, parse_header, send_frame

    assert parse_header(b'{"step": "cell", "cell": 3, "part": "p"}') == {"step": "cell", "cell": 3, "part": "p"}
    for bad in (b"[" * 100_000 + b"]" * 100_000, b'{"step": "cell", "cell": [1]}', b'{"step": 1}', b"\xff",
                b'{"step": "cell", "extra": "x"}', b'{"step": "x", "message": "' + b"m" * 20_000 + b'"}'):
        assert parse_header(bad) is None
    read_end, write_end = os.pipe()
    reader = FrameReader(read_end, max_frames=2, max_bytes=1_000, blob_limit=100)
    send_frame(write_end, b"one")
    send_frame(write_end, b"two")
    send_frame(write_end, b"three")  # one too many
    os.close(write_end)
    reader.join(10)
    assert reader.take(0) == [b"one", b"two"] and "more messages" in reader.violation


def test_a_submission_is_read_once_as_a_regular_file(tmp_path):
    from attention_course.grading.isolation import clean_text, read_submission

    good = tmp_path / "good.ipynb"
    good.write_bytes(b"{}")
    snapshot = read_submission(good, 100)
    assert snapshot.data == b"{}" and snapshot.sha256 == hashlib.sha256(b"{}").hexdigest()
    (tmp_path / "link.ipynb").symlink_to(good)
    os.mkfifo(tmp_path / "fifo.ipynb")
    assert "symbolic link" in read_submission(tmp_path / "link.ipynb", 100)
    assert "not a regular file" in read_submission(tmp_path / "fifo.ipynb", 100)  # and it did not block
    assert "more than" in read_submission(good, 1)
    assert clean_text("a\x1b[31mb\x1b[0m\r\nc\x07") == "ab c"


# --- issue 42: the instructor's process bounded, the sandbox hardened as root ----------------------------
# Each notebook below is graded by the documented command (`python -m attention_course.grading .`, run in the
# submissions folder, --csv and --json), next to an honest classmate. Each test fails on the code before
# issue 42: the pickle bomb's results were unpickled in the grader (about 10 s and a gigabyte for its 8M
# opcodes on this machine, gigabytes and minutes at the 64 MB cap), the forty crashing cells each cost a
# fresh sandbox (292 s against a 24 s budget in the report), the helpers' analysis grew quadratically with
# the notebook, the formula file name landed verbatim in the CSV.
PICKLE_BOMB = """
import io, json, os, struct, zipfile, torch
def hard_attention_weights(scores):
    honest = io.BytesIO()
    torch.save([], honest)
    bomb = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(honest.getvalue())) as source, \\
            zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_STORED) as target:
        for record in source.infolist():
            data = source.read(record)
            if record.filename.endswith("data.pkl"):
                data = b"\\x80\\x02" + b"]" * 8_000_000 + b"."  # 8M EMPTY_LIST opcodes
            target.writestr(record.filename, data)
    blob = bomb.getvalue()
    header = json.dumps({"step": "part_done", "part": "hard_attention_weights", "size": len(blob)}).encode()
    for fd in range(3, 64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, struct.pack(">I", len(header)) + header)
                view = memoryview(struct.pack(">I", len(blob)) + blob)
                while view:
                    view = view[os.write(fd, view):]
        except OSError:
            pass
    os._exit(0)
import stat
"""

USER_NAMESPACE = """
import os, ctypes, subprocess
def hard_attention_weights(scores):
    for attempt in (lambda: ctypes.CDLL(None, use_errno=True).unshare(0x10000000),
                    lambda: subprocess.run(["unshare", "-U", "true"]).returncode):
        try:
            if attempt() == 0:
                raise RuntimeError("LEAK: made a user namespace")
        except (OSError, PermissionError, ValueError, ImportError):
            pass
    raise NotImplementedError
"""

FORMULA_NAME = '=HYPERLINK("example.invalid","click").ipynb'
HELPERS = 20_000  # about 1.3 MB of helpers that call each other


def _copy_graded(nb: nbformat.NotebookNode, part: str, source: str, copies: int) -> None:
    """Insert ``copies`` more graded cells of ``part`` (same tags and metadata) after its graded cell."""
    import copy

    cell = graded_cell(nb, part)
    index = nb.cells.index(cell)
    for number in range(copies):
        extra = copy.deepcopy(cell)
        extra.source = source
        if "id" in extra:
            extra["id"] = f"extra-{number}"
        nb.cells.insert(index + 1 + number, extra)


@pytest.fixture(scope="module")
def bounded(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("issue42")
    sub = base / "submissions"
    sub.mkdir()
    solution = nbformat.read(SOLUTION, as_version=4)
    nbformat.write(solution, sub / "honest.ipynb")
    nbformat.write(solution, sub / FORMULA_NAME)

    nb = nbformat.read(LEARNER, as_version=4)
    graded_cell(nb, "hard_attention_weights").source = PICKLE_BOMB
    nbformat.write(nb, sub / "attack_pickle_bomb.ipynb")

    nb = nbformat.read(SOLUTION, as_version=4)
    _copy_graded(nb, "hard_attention_weights", "import os\nos._exit(1)\n", 40)
    nbformat.write(nb, sub / "attack_forty_exits.ipynb")

    nb = nbformat.read(SOLUTION, as_version=4)
    graded_cell(nb, "hard_attention_weights").source = (
        "def hard_attention_weights(scores):\n    return helper_0(scores)\n")
    helpers = [f"def helper_{i}(x):\n    return helper_{i + 1}(x) + helper_{(i * 7 + 3) % HELPERS}(x)\n"
               for i in range(HELPERS)]
    for start in range(0, HELPERS, 500):
        nb.cells.append(nbformat.v4.new_code_cell("\n".join(helpers[start:start + 500])))
    nbformat.write(nb, sub / "attack_carried_helpers.ipynb")

    nb = nbformat.read(LEARNER, as_version=4)
    graded_cell(nb, "hard_attention_weights").source = USER_NAMESPACE
    nbformat.write(nb, sub / "attack_user_namespace.ipynb")

    command = [sys.executable, "-m", "attention_course.grading", ".", "--json", str(base / "grades.json"),
               "--csv", str(base / "grades.csv"), "--jobs", str(JOBS), "--timeout", str(TIMEOUT), "--seed", "0"]
    started = time.monotonic()
    run = subprocess.run(command, capture_output=True, text=True, cwd=sub, timeout=900,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = {Path(entry["path"]).name: entry
               for entry in json.loads((base / "grades.json").read_text())["notebooks"]}
    return {"results": results, "csv": (base / "grades.csv").read_text(), "stdout": run.stdout,
            "seconds": time.monotonic() - started}


def _part(entry: dict, name: str = "hard_attention_weights") -> dict:
    return next(part for part in entry["parts"] if part["name"] == name)


def test_a_pickle_bomb_in_the_results_is_refused_unread(bounded):
    entry = bounded["results"]["attack_pickle_bomb.ipynb"]
    assert entry["score"] == 0 and bounded["results"]["honest.ipynb"]["score"] == 8
    assert "wire format" in _part(entry)["message"], _part(entry)  # before: unpickled, then "incomplete"
    assert entry["seconds"] < notebook_budget(TIMEOUT), entry["seconds"]  # before: 78 s here


def test_forty_crashing_graded_cells_cost_one_sandbox(bounded):
    """One graded cell per part is sent (the last that defines its function): the 40 copies that call
    os._exit(1) never run, and the notebook is graded in one attempt, within one notebook's budget."""
    entry = bounded["results"]["attack_forty_exits.ipynb"]
    assert "more than one graded cell for hard_attention_weights" in entry["message"], entry["message"]
    assert entry["score"] == 8, entry  # the notebook's own answers, judged as a top-to-bottom run leaves them
    assert entry["seconds"] < notebook_budget(TIMEOUT) + 10, entry["seconds"]


def test_helpers_that_call_each_other_are_analysed_in_bounded_time(bounded):
    entry = bounded["results"]["attack_carried_helpers.ipynb"]
    message = entry["message"] + _part(entry)["message"]
    # Either the analysis finished (and the cell it makes is too long to read) or it stopped at its deadline.
    assert "more than the 200,000" in message or "nothing was carried" in message, message
    assert _part(entry)["score"] == 0 and entry["score"] == 7, entry
    assert entry["seconds"] < notebook_budget(TIMEOUT), entry["seconds"]


def test_a_formula_file_name_is_text_in_the_csv(bounded):
    rows = list(csv.reader(io.StringIO(bounded["csv"])))
    assert any(row[0] == "'" + FORMULA_NAME for row in rows), [row[0] for row in rows]
    for row in rows:
        for cell in row:
            assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), cell


def test_learner_code_makes_no_user_namespace_through_the_grader(bounded):
    """Through the documented command the run-time guard refuses ctypes and other programs first; the
    seccomp filter under it is tested on its own (test_sandbox: test_no_user_namespace_inside_the_sandbox)."""
    entry = bounded["results"]["attack_user_namespace.ipynb"]
    assert entry["score"] == 0 and "LEAK" not in json.dumps(entry), entry
