"""Exercise 11, making attention fast: the checks behind ``exercises/ex11_efficient_attention.ipynb``.

The learner writes appending to a KV cache, the online-softmax update (running maximum and sum), one block step
of tiled attention, and tiled attention itself, which must never create a tensor as large as the score matrix.
References in float64: ``torch.cat``, ``torch.logsumexp``, ``F.scaled_dot_product_attention`` and the library's
``tiled_attention_step``. Recognised: new positions first, an old sum not rescaled, a decreasing maximum, overflow,
the score matrix's memory, a call to an attention kernel, key blocks counted over the queries.
"""

from __future__ import annotations

import builtins
import ctypes
import gc
import io
import math
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from attention_course.grading.compare import close_problem, f64, float32_atol
from attention_course.grading.declare import Check, Out, View, second_run
from attention_course.grading.findings import FailureKind, Finding
from attention_course.grading.package_view import instructor_side
from attention_course.grading.spec import (
    Case,
    Exercise,
    Mistake,
    Part,
    call_function,
    degenerate,
    preamble,
    randn,
    unwatched,
    with_texts,
)

PREAMBLE = preamble()
# The grader's references: imported only in its process, so that ``tiled.py`` is not in the sandbox's view.
reference_step = instructor_side("attention_course.tiled", "tiled_attention_step")


# --- part 1: appending to a KV cache ---------------------------------------------------------------------
def _append_cases(g: torch.Generator) -> list[Case]:
    def kv(batch: int, heads: int, length: int, d_k: int, d_v: int, dtype=torch.float32):
        return randn(g, batch, heads, length, d_k, dtype=dtype), randn(g, batch, heads, length, d_v, dtype=dtype)

    return [
        degenerate(Case("empty cache (None) and the first position", (None, None, *kv(2, 3, 1, 4, 4)))),
        Case("5 cached positions and 1 new one", (*kv(2, 3, 5, 4, 6), *kv(2, 3, 1, 4, 6))),
        Case("4 cached positions and a prompt of 3 new ones", (*kv(1, 2, 4, 8, 8), *kv(1, 2, 3, 8, 8))),
        Case("batch 3, 2 heads, 2 cached, 2 new (check the axis)", (*kv(3, 2, 2, 5, 3), *kv(3, 2, 2, 5, 3))),
        Case("float64 tensors keep their dtype",
             (*kv(1, 1, 3, 2, 2, torch.float64), *kv(1, 1, 1, 2, 2, torch.float64))),
    ]


def _in_order(name: str) -> Callable[[View], str | None]:
    """A step: the learner's ``name`` (keys or values) must be the cached ones, then the new ones, exactly."""
    def step(v: View) -> str | None:
        actual, expected = f64(getattr(v.got, name)), getattr(v.want, name)
        if torch.equal(actual, expected):
            return None
        past, new = (0 if v.args[0] is None else v.args[0].shape[-2]), v.args[2].shape[-2]
        if past and torch.equal(actual[..., :new, :], expected[..., past:, :]):
            return f"your {name} start with the new positions: the cached ones must come first (oldest first)"
        return (f"your {name} differ from the cached {name} followed by the new ones along the length "
                "dimension (dim -2)")
    return step


_APPEND = Check(
    reference=lambda v: tuple(new if past is None else torch.cat([past, new], dim=-2)
                              for past, new in ((v.x[0], v.x[2]), (v.x[1], v.x[3]))),
    outputs=(Out("keys", dtype=lambda v: v.args[2].dtype), Out("values")),
    explain=(_in_order("keys"), _in_order("values")),
)


# --- part 2: the online-softmax update -------------------------------------------------------------------
def _finite_shift(maximum: torch.Tensor) -> torch.Tensor:
    """The maximum to subtract inside exp: 0 for a row that has seen no finite score (so exp gives 0, not NaN)."""
    return torch.where(torch.isneginf(maximum), torch.zeros_like(maximum), maximum)


def _state_after(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Running (max, sum) after the given scores, from their definition (the reference, never the learner's)."""
    running_max = scores.amax(dim=-1)
    return running_max, torch.exp(scores - _finite_shift(running_max)[..., None]).sum(dim=-1)


def _online_cases(g: torch.Generator) -> list[Case]:
    def start(*shape: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full(shape, -math.inf), torch.zeros(shape)

    def after(name: str, previous: torch.Tensor, block: torch.Tensor, **data: Any) -> Case:
        """A case whose state comes from earlier scores ``previous`` (kept for the messages)."""
        return Case(name, (*_state_after(previous), block), data={"previous": previous, **data})

    previous = randn(g, 4, 6, scale=2.0)
    growing = randn(g, 4, 5, scale=2.0)
    growing[0] += 5.0  # row 0's maximum grows in this block, row 1's cannot
    growing[1] -= 10.0
    huge_previous, huge_block = 1e4 + randn(g, 3, 4), 1e4 + randn(g, 3, 4, scale=3.0)
    masked_previous, masked_block = randn(g, 3, 5), randn(g, 3, 6)
    masked_block[0, :3] = -math.inf
    masked_block[1, :] = -math.inf  # a fully masked block: the state must not change
    never_seen = torch.full((2, 3), -math.inf)
    never_seen[1, 0] = 0.5
    masked_block[0, 3] = masked_previous[0].max() + 1.0  # row 0's maximum grows: the old sum must be rescaled
    batched_previous = randn(g, 2, 3, 4)
    double_previous = randn(g, 3, 7, dtype=torch.float64)
    single, double_block, batched_block = randn(g, 4, 1), randn(g, 3, 4, dtype=torch.float64), randn(g, 2, 3, 5)
    # In every case some row's maximum grows (here row 0's), so a running sum or accumulator that is not rescaled
    # shows on every draw, not only when the random scores happen to rise.
    single[0, 0] = previous[0].max() + 1.0
    double_block[0, 0] = double_previous[0].max() + 1.0
    batched_block[1, 2, 0] = batched_previous[1, 2].max() + 1.0
    return [
        degenerate(Case("the first block: state (-inf, 0), scores (4, 8)", (*start(4), randn(g, 4, 8)))),
        after("a second block: state from 6 earlier scores, 5 new ones", previous, growing),
        after("a block of a single score per row", previous, single),
        after("leading dimensions: state (2, 3), scores (2, 3, 5)", batched_previous, batched_block),
        after("scores around 1e4 (overflow test)", huge_previous, huge_block, stability=True),
        after("masked scores (-inf), and a row whose whole block is masked", masked_previous, masked_block),
        Case("a row that has seen no score yet and gets only -inf (must stay -inf, 0, not NaN)",
             (*start(2), never_seen)),
        after("float64 keeps its dtype", double_previous, double_block),
    ]


def _online_reference(v: View) -> tuple[torch.Tensor, torch.Tensor]:
    m, running_sum, s = v.x
    expected_max = torch.maximum(m, s.amax(dim=-1))
    # m' + log ℓ' must be the log-sum-exp of everything seen: the old state's and the new block's.
    total_lse = torch.logaddexp(m + torch.log(running_sum), torch.logsumexp(s, dim=-1))
    return expected_max, torch.exp(total_lse - _finite_shift(expected_max))


def _running_max(v: View) -> str | None:
    new_max, expected = f64(v.output[0]), _online_reference(v)[0]
    if torch.isnan(new_max).any():
        return Finding("your running maximum contains NaN", FailureKind.NOT_FINITE)
    if (new_max < v.x[0]).any():
        return Finding("your running maximum decreased for some row: it is the maximum of the old one and the block",
                       FailureKind.PROPERTY)
    return close_problem(new_max.nan_to_num(neginf=-1e300), expected.nan_to_num(neginf=-1e300),
                         "your running maximum", "max(old maximum, largest new score)", atol=1e-6, rtol=1e-7)


def _rescaled_sum(v: View) -> str | None:
    new_sum, (expected_max, expected_sum) = v.output[1], _online_reference(v)
    problem = close_problem(new_sum, expected_sum, "your running sum",
                            "sum over all scores so far of exp(score - new maximum)", atol=1e-5, rtol=1e-4)
    if problem is None:
        return None
    m, running_sum, s = v.x
    unscaled = running_sum + torch.exp(s - _finite_shift(expected_max)[..., None]).sum(dim=-1)
    if torch.allclose(f64(new_sum), unscaled, atol=1e-5, rtol=1e-4):
        return problem + "; the old sum must be rescaled by exp(old maximum - new maximum)"
    return problem


def _stability(message: str) -> Callable[[View], str]:
    return lambda v: message if v.data.get("stability") else ""


def _online_advice(v: View) -> str:
    """What a NaN or an infinity in the running sum says: overflow, or exp(-inf - (-inf)) in a row that has
    seen no finite score."""
    if v.data.get("stability"):
        return " (subtract the new running maximum inside exp)"
    if torch.isneginf(torch.maximum(v.x[0], v.x[2].amax(dim=-1))).any():
        return (": a row whose maximum is still -inf gives exp(-inf - (-inf)) = NaN; subtract 0 instead of the "
                "maximum in such rows (their sum stays 0)")
    return ""


def _unshifted_block(v: View) -> torch.Tensor:
    m, running_sum, s = v.x
    new_max = torch.maximum(m, s.amax(dim=-1))
    return running_sum * torch.exp(m - _finite_shift(new_max)) + torch.exp(s).sum(dim=-1)


_ONLINE = Check(
    reference=_online_reference,
    outputs=(Out("running maximum", finite=False),
             Out("running sum", by_rows=False, dtype=lambda v: v.args[2].dtype)),
    advice=_online_advice,
    mistakes=(Mistake(_unshifted_block, "you exponentiated the new scores without shifting them: the block adds "
                                        "exp(score - new maximum) for each score, like the rescaled old sum",
                      on="running sum"),),
    explain=(_running_max, _rescaled_sum),
)


# --- part 3: one block step of tiled attention -----------------------------------------------------------
def _step_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, batch: tuple, bq: int, bk_prev: int, bk: int, d_k: int, d_v: int, scale_q: float = 1.0,
             dtype=torch.float32, lower: bool = False) -> Case:
        query = randn(g, *batch, bq, d_k, scale=scale_q, dtype=dtype)
        prev_k, prev_v = randn(g, *batch, bk_prev, d_k, dtype=dtype), randn(g, *batch, bk_prev, d_v, dtype=dtype)
        key, value = randn(g, *batch, bk, d_k, dtype=dtype), randn(g, *batch, bk, d_v, dtype=dtype)
        if lower:  # earlier keys include each query itself (score |q|²/√d_k > 0), new keys score about 0
            prev_k[..., :bq, :] = query
            key = key * 0.01
        elif bk_prev:  # the first query's maximum grows in this block (Cauchy-Schwarz): the old state must be rescaled
            first = query[..., 0, :]
            longest = prev_k.norm(dim=-1).amax(dim=-1, keepdim=True)
            key[..., 0, :] = 2.0 * longest * first / first.norm(dim=-1, keepdim=True)
        scale = 1.0 / math.sqrt(d_k)
        rows = (*batch, bq)  # nothing seen yet: accumulator 0, running maximum -inf, running sum 0
        state = (torch.zeros(*rows, d_v, dtype=dtype), torch.full(rows, -math.inf, dtype=dtype),
                 torch.zeros(rows, dtype=dtype))
        data = {}
        if bk_prev:  # the state after an earlier block of keys
            state = reference_step(*state, query, prev_k, prev_v, scale)
            data = {"previous_key": prev_k, "previous_value": prev_v}
        data["stability"] = scale_q > 1.0
        return Case(name, (*state, query, key, value, scale), data=data)

    return [
        degenerate(case("the first block: 4 queries, 5 keys, d_k = 8, d_v = 6", (), 4, 0, 5, 8, 6)),
        case("a second block: 3 earlier keys, 4 new ones", (), 4, 3, 4, 8, 8),
        case("leading dimensions (2, 3): batch and heads", (2, 3), 3, 5, 4, 4, 5),
        case("large scores (in the hundreds: overflow test)", (), 4, 4, 4, 16, 4, scale_q=100.0),
        case("new keys that score below the running maximum", (), 5, 6, 3, 8, 4, lower=True),
        case("float64 keeps its dtype", (2,), 3, 2, 3, 4, 4, dtype=torch.float64),
    ]


def _attention_so_far(v: View) -> str | None:
    """Property: after this step, O / ℓ is attention over every key seen so far (earlier block + this one)."""
    _, _, _, query, keys, values, scale = v.x
    if "previous_key" in v.data:
        keys = torch.cat([f64(v.data["previous_key"]), keys], dim=-2)
        values = torch.cat([f64(v.data["previous_value"]), values], dim=-2)
    reference = F.scaled_dot_product_attention(query, keys, values, scale=scale)
    ratio = f64(v.output[0]) / f64(v.output[2])[..., None]
    return close_problem(ratio, reference, "accumulator / running sum",
                         "F.scaled_dot_product_attention over all keys seen so far", atol=1e-4, rtol=1e-4)


def _step_variant(v: View, rescale: bool = True, scale: float | None = None) -> torch.Tensor:
    """The accumulator after one block step, with the old accumulator not rescaled or another score scale."""
    accumulator, running_max, _, query, key, value, given = v.x
    scores = query @ key.transpose(-2, -1) * (given if scale is None else scale)
    new_max = torch.maximum(running_max, scores.amax(dim=-1))
    shift = _finite_shift(new_max)
    old = accumulator * torch.exp(running_max - shift)[..., None] if rescale else accumulator
    return old + torch.exp(scores - shift[..., None]) @ value


_STEP_MISTAKES = (
    Mistake(lambda v: _step_variant(v, rescale=False),
            "your accumulator keeps its old value unscaled: when the running maximum grows, multiply the old "
            "accumulator by exp(old maximum - new maximum), as the running sum is, before adding the block"),
    Mistake(lambda v: _step_variant(v, scale=1.0),
            "your scores are not multiplied by `scale` (the 1/sqrt(d_k) the function is given): the block's "
            "scores are (query @ keyᵀ) * scale"),
)

_STEP = Check(
    # Relative tolerances: state values scale with exp(scores - max), which is at most the number of keys.
    reference=lambda v: tuple(t.nan_to_num(neginf=-1e300) for t in reference_step(*v.x)),
    outputs=(Out("accumulator", "the online-softmax update", atol=1e-4, by_rows=False,
                 dtype=lambda v: v.args[3].dtype),
             Out("running maximum", "the online-softmax update", atol=1e-4, by_rows=False),
             Out("running sum", "the online-softmax update", atol=1e-4, by_rows=False)),
    advice=_stability(" (subtract the running maximum inside exp)"),
    mistakes=_STEP_MISTAKES,
    after=(_attention_so_far,),
)


# --- part 4: tiled attention -----------------------------------------------------------------------------
def _tiled_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, batch: tuple, q_len: int, k_len: int, d_k: int, d_v: int, block: int,
             scale_q: float = 1.0, dtype=torch.float32, memory: bool = False) -> Case:
        query = randn(g, *batch, q_len, d_k, scale=scale_q, dtype=dtype)
        key, value = randn(g, *batch, k_len, d_k, dtype=dtype), randn(g, *batch, k_len, d_v, dtype=dtype)
        # Only the large cases tell a tiled loop from the full score matrix (in PyTorch or NumPy), so only
        # they earn proportional credit; the small ones must pass too, for full marks.
        return Case(name, (query, key, value, block), data={"memory": memory}, credit=memory)

    return [
        case("8 queries, 8 keys, blocks of 4", (), 8, 8, 16, 16, 4),
        case("10 queries, 13 keys, blocks of 4 (lengths not multiples of the block)", (), 10, 13, 8, 8, 4),
        case("13 queries, 6 keys, blocks of 5, d_v = 3", (), 13, 6, 8, 3, 5),
        case("leading dimensions (2, 3), 9 positions, blocks of 3", (2, 3), 9, 9, 8, 8, 3),
        case("blocks of 1", (2,), 5, 7, 4, 4, 1),
        case("one block larger than everything", (), 6, 9, 4, 4, 64),
        case("large scores (in the hundreds)", (), 8, 8, 16, 8, 4, scale_q=100.0),
        case("float64 keeps its dtype", (), 7, 7, 4, 4, 3, dtype=torch.float64),
        case(f"{MEMORY_LENGTH} queries and keys, blocks of 64: no memory for the score matrix", (), MEMORY_LENGTH,
             MEMORY_LENGTH, 16, 16, 64, memory=True),
        case("1500 queries, 2100 keys, blocks of 100, d_v = 4: no memory for the score matrix", (), 1500, 2100, 8, 4,
             100, memory=True),
    ]


#: Queries and keys of the memory case: its full float32 score matrix takes 16 MiB, far above the noise of
#: a process's peak memory (a correct tiled loop adds under 1 MiB).
MEMORY_LENGTH = 2048
#: The most memory (bytes, above what the process held before) the memory case may add.
MEMORY_ALLOWANCE = MEMORY_LENGTH * MEMORY_LENGTH * 4 // 4
#: Kernels that compute attention whole: calling one is not writing the tiled loop.
_ATTENTION_KERNELS = ("scaled_dot_product", "flash_attention", "efficient_attention", "multi_head_attention",
                      "_native_multi_head_attention")


# The worker's own references, taken when the module is imported (before any learner code could replace them).
_open, _save, _load = open, torch.save, torch.load
try:
    _LIBC = ctypes.CDLL(None)
    _mallopt, _malloc_trim, _prctl = _LIBC.mallopt, _LIBC.malloc_trim, _LIBC.prctl
except (OSError, AttributeError):  # pragma: no cover - not glibc
    _mallopt = _malloc_trim = _prctl = None
_M_MMAP_THRESHOLD, _PR_GET_DUMPABLE, _PR_SET_DUMPABLE = -3, 3, 4  # glibc's mallopt and Linux's prctl options


class _RefuseAttentionCalls(TorchFunctionMode):
    """While active, every attention function of PyTorch raises when called (``F.scaled_dot_product_attention``
    and the like; a dispatch mode would also see the kernels, but it imports ``torch._dynamo`` on first use,
    which the worker's guard does not allow learner code to trigger)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = str(getattr(func, "__name__", func))
        if any(kernel in name for kernel in _ATTENTION_KERNELS):
            raise RuntimeError(f"tiled_attention must compute attention itself, one tile at a time; it called {name}")
        return func(*args, **(kwargs or {}))


_PR_SET_CHILD_SUBREAPER = 36  # Linux's prctl option: orphaned descendants are reparented to this process
#: The largest output (bytes, serialised) the measured process may send.
_OUTPUT_LIMIT = 64 << 20


def _status_of(pid: int) -> dict[str, int]:
    """Resident memory of process ``pid`` now and at its peak (``VmRSS``, ``VmHWM``), in bytes, read from
    ``/proc/<pid>/status`` (readable by any process, whatever the target's dumpable flag)."""
    found: dict[str, int] = {}
    with _open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) * 1024
    if set(found) != {"VmRSS", "VmHWM"}:
        raise OSError(f"/proc/{pid}/status gives no VmRSS or VmHWM")
    return found


#: A page the learner's process made its own during the calls (wrote in place, copying a page it shared with the
#: process it was forked from, or touched new and kept) counts only within a run of at least this many
#: neighbouring such pages (256 KiB). A buffer made before the call and filled with scores is one long run;
#: the pages that any call's small allocations and reference counts write lie scattered, and their number
#: grows with what the process did before (0.6 MiB in a fresh worker, up to 10 MiB after a test session).
OWN_RUN_PAGES = 64
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096  # Windows: no /proc to read anyway
_EXCLUSIVE = 1 << 56  # /proc/<pid>/pagemap: the page is mapped by this process alone (bit 63, the sign: present)


def _own_pages_of(pid: int) -> list[tuple[int, torch.Tensor]]:
    """For each writable private mapping of process ``pid``, its start address and which of its pages the
    process alone holds (present, and shared with no other process), from ``/proc/<pid>/maps`` and
    ``/proc/<pid>/pagemap`` (the process must be dumpable; the flags need no privilege)."""
    found = []
    with _open(f"/proc/{pid}/maps", encoding="ascii", errors="replace") as maps, \
            _open(f"/proc/{pid}/pagemap", "rb", buffering=0) as pagemap:
        for line in maps:
            fields = line.split()
            if len(fields) < 2 or fields[1] != "rw-p":
                continue
            start, end = (int(address, 16) for address in fields[0].split("-"))
            pages = (end - start) // _PAGE
            pagemap.seek(start // _PAGE * 8)
            data = pagemap.read(pages * 8)
            entries = torch.zeros(pages, dtype=torch.int64)
            if data:
                entries[:len(data) // 8] = torch.frombuffer(bytearray(data), dtype=torch.int64)
            found.append((start, (entries < 0) & ((entries & _EXCLUSIVE) != 0)))
    return found


def _made_own_in_runs(before: list[tuple[int, torch.Tensor]], after: list[tuple[int, torch.Tensor]]) -> int:
    """The bytes of the pages that are the process's own in ``after`` and were not in ``before`` (both from
    :func:`_own_pages_of`), counting only runs of at least :data:`OWN_RUN_PAGES` neighbouring pages."""
    total = 0
    for start, own in after:
        made = own.clone()
        end = start + len(own) * _PAGE
        for start_before, own_before in before:
            low, high = max(start, start_before), min(end, start_before + len(own_before) * _PAGE)
            if low < high:
                made[(low - start) // _PAGE:(high - start) // _PAGE] &= \
                    ~own_before[(low - start_before) // _PAGE:(high - start_before) // _PAGE]
        if int(made.sum()) < OWN_RUN_PAGES:
            continue
        edges = torch.diff(made.to(torch.int8), prepend=torch.zeros(1, dtype=torch.int8),
                           append=torch.zeros(1, dtype=torch.int8))
        lengths = torch.nonzero(edges < 0).flatten() - torch.nonzero(edges > 0).flatten()  # each run's pages
        total += int(lengths[lengths >= OWN_RUN_PAGES].sum()) * _PAGE
    return total


def _reset_peak_of(pid: int) -> None:
    """Make process ``pid``'s peak resident set (``VmHWM``, and the ``ru_maxrss`` its parent gets when it ends)
    its resident set now (``/proc/<pid>/clear_refs``, Linux 4.0 and later): the peak a forked process inherits,
    or that it held before heap pages went back, is not the call's. Where the file cannot be written, the peak
    stays the process's whole life's, which can only fail a tiled loop, never pass a full score matrix."""
    try:
        with _open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass


def _set_dumpable(flag: int) -> None:
    if _prctl is not None:
        _prctl(_PR_SET_DUMPABLE, flag, 0, 0, 0)


def _children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from ``/proc/*/stat``; the sandbox's PID namespace keeps the
    scan short)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with _open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def _reap_descendants() -> None:
    """Wait for every process of this one's tree: its children and, as a child subreaper, every orphaned
    descendant (killed first: nothing the learner started may outlive the measurement). Their peaks then count
    in ``getrusage(RUSAGE_CHILDREN)``."""
    me = os.getpid()
    while True:
        for pid in _children_of(me):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _handshake(ready: int, go: int, step: bytes) -> None:
    """The learner's process (trusted code, between the calls): say ``step`` and wait until the measuring
    process has read what it needs."""
    os.write(ready, step)
    if os.read(go, 1) != b"g":
        os._exit(3)


def _threads() -> int:
    with _open("/proc/self/status", encoding="ascii") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


def _readable(ready: int, go: int, step: bytes, threads: int) -> None:
    """A handshake while this process is dumpable (so the measuring process can read its ``pagemap``):
    only with no more threads than ``threads``, the count before any learner code ran (this one, and the
    idle worker threads of PyTorch's pool where the process had set a larger pool before the fork), none
    of which runs learner code now (a thread of the learner's could otherwise open this process's ``/proc``
    files meanwhile)."""
    if _threads() > threads:
        raise RuntimeError("your function left threads running; compute in the thread that calls it")
    _set_dumpable(1)
    try:
        _handshake(ready, go, step)
    finally:
        _set_dumpable(0)


def _warm_up(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, block: int) -> None:
    """Before any learner code: allocate, use and free tensors as any tiled loop does (scores of one block,
    their maximum, exponentials, sums, a weighted sum), so that the pages this first use writes (the lists of
    free memory that the allocator sorts on its first requests after the fork, the kernels' own state) are
    this process's own before the measurement starts, and do not count as the learner's call's."""
    for start in range(0, key.shape[-2], block):
        scores = query @ key[..., start:start + block, :].transpose(-2, -1)
        weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
        weights.sum(dim=-1, keepdim=True), weights @ value[..., start:start + block, :]


def _call_in_child(obj: Any, small: Case, case: Case, data: int, ready: int, go: int) -> None:
    """The measured child: warm up, make the small call and the large one, send the output (never a
    measurement), and between these steps let the measuring parent read this process's memory. Dumpable (so
    the parent can read its ``pagemap``) only within those steps, never while learner code runs."""
    code = 0
    # The collector would write into every object it visits, pages this process shares with its parent: their
    # private copies would count as the call's memory.
    gc.disable()
    try:
        torch.set_num_threads(1)  # the parent's thread pool did not survive the fork
        _warm_up(*small.args)
        torch.ones(1 << 17).sum()  # a parallel region: a pool the parent had set up starts its threads now
        _save({"output": small.args[0], "error": None}, io.BytesIO())  # and the code that sends the output
        own_threads = _threads()  # before any learner code: PyTorch's own pool threads at most
        _readable(ready, go, b"A", own_threads)  # before any learner code: the private pages
        with _RefuseAttentionCalls():
            call_function(obj, small)  # loads whatever code the function needs
            if _malloc_trim is not None:  # free heap pages go back: what the large call uses shows
                _malloc_trim(0)
            # the baseline of the peak: the resident set before the large call
            _readable(ready, go, b"B", own_threads)
            output = call_function(obj, case)
        message = {"output": output if isinstance(output, torch.Tensor) else None, "error": None}
    except BaseException as exc:  # the learner's error goes back as the outcome
        message = {"output": None, "error": str(exc)[:2000], "type": type(exc).__name__[:100]}
        code = 1
    _handshake(ready, go, b"D")  # the peak, read first (not dumpable: nothing can reset it)
    buffer = io.BytesIO()
    _save(message, buffer)
    payload = buffer.getvalue()
    with _open(data, "wb") as pipe:  # its length first: a process the learner started may hold the pipe open
        pipe.write(len(payload).to_bytes(8, "little") + payload)
    try:
        _readable(ready, go, b"E", own_threads)  # what the calls wrote
    except BaseException:
        os._exit(4)
    os._exit(code)


def _measure(obj: Any, small: Case, case: Case, result: int) -> int:
    """The measuring process: fork the learner's call, read its memory from outside it, wait for its whole
    tree, and send the output with the measurement to ``result``; returns the exit code."""
    if _prctl is None or _prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:  # pragma: no cover - not Linux
        _send(result, -1, "the memory case needs Linux (a child subreaper, Linux 3.4 and later)", b"")
        return 1
    _set_dumpable(0)  # no process of the learner's may trace this one or write into its memory
    if _mallopt is not None:  # every allocation of the call shows: no resident free heap pages to reuse
        _mallopt(_M_MMAP_THRESHOLD, 128 * 1024)
        _malloc_trim(0)
    data_r, data_w = os.pipe()
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the learner's process: none of the measuring process's descriptors stay open in it
        for fd in (result, data_r, ready_r, go_w):
            os.close(fd)
        _call_in_child(obj, small, case, data_w, ready_w, go_r)
    for fd in (data_w, ready_w, go_r):
        os.close(fd)
    reads: dict[bytes, dict[str, int]] = {}
    own: dict[bytes, list[tuple[int, torch.Tensor]]] = {}
    payload, problem, ended_early = b"", None, False
    try:
        with _open(data_r, "rb") as pipe:
            for step in (b"A", b"B", b"D", b"E"):
                said = os.read(ready_r, 1)
                ended_early = said == b"D" and step != b"D"  # an error before the calls ended: the outcome
                if said != step and not ended_early:
                    raise OSError("its steps were broken off")
                if said == b"B":  # the peak from here on is the large call's
                    _reset_peak_of(pid)
                reads[said] = _status_of(pid)
                if said in (b"A", b"E"):
                    own[said] = _own_pages_of(pid)
                os.write(go_w, b"g")
                if said == b"D":  # then the output, its length first
                    size = int.from_bytes(pipe.read(8).ljust(8, b"\0"), "little")
                    if size > _OUTPUT_LIMIT:
                        raise OSError("its output was too large")
                    payload = pipe.read(size)
                if ended_early:
                    break
    except (OSError, ValueError, StopIteration) as exc:
        problem = f"your function's memory could not be measured ({exc}): did it end or stop its own process?"
    os.close(go_w)  # a learner's process still waiting ends
    _reap_descendants()
    added = -1
    if ended_early:
        added = 0
    elif problem is None:
        import resource

        # The peak of the learner's process and of every process it started (each from its own peak resident
        # set, shared pages included) above the resident set before the large call; or, if larger, the memory
        # the calls made their own and kept (a buffer made when the cell ran, or in the small call, and filled).
        tree_peak = max(reads[b"D"]["VmHWM"], resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
        added = max(tree_peak - reads[b"B"]["VmRSS"], _made_own_in_runs(own[b"A"], own[b"E"]))
    _send(result, added, problem, payload)
    return 0


def _send(result: int, added: int, problem: str | None, payload: bytes) -> None:
    """The measuring process's answer: the measurement, or why there is none, and the learner's output."""
    buffer = io.BytesIO()
    _save({"added": added, "problem": problem,
           "child": torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else None}, buffer)
    with _open(result, "wb") as pipe:
        pipe.write(buffer.getvalue())


def _measured_call(obj: Any, case: Case) -> tuple[Any, int]:
    """Call the learner's function in a forked child and return its output and the most memory the call added
    (numbers, tensors and NumPy arrays alike, in that child or in any process it starts).

    The measurement is taken outside the learner's code: a measuring process (a fork of this one, a child
    subreaper that is not dumpable) forks the learner's process and reads its ``/proc`` files between the
    steps (its resident set before the calls, its peak after them, the memory it wrote that it shared with
    this process), then waits for every descendant (orphans are reparented to it) and takes their peaks from
    ``getrusage(RUSAGE_CHILDREN)``. The learner's process sends only its output; no number it sends is read.
    A small call first loads whatever code the function needs, after the library's own tiled loop has made
    the pages any such loop writes the child's; it counts with the large one."""
    small = Case("warm-up", (case.args[0][:8], case.args[1][:8], case.args[2][:8], case.args[3]))
    obj = unwatched(obj)  # the input watch's copies would count as the call's memory (other cases are watched)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the measuring process (never returns)
        code = 70
        try:
            os.close(read_end)
            code = _measure(obj, small, case, write_end)
        finally:
            os._exit(code)
    os.close(write_end)
    with _open(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    if not data:
        raise RuntimeError("your function ended the process that measured it")
    measured = _load(io.BytesIO(data), weights_only=True)
    if measured["problem"] is not None:
        raise RuntimeError(measured["problem"])
    if measured["child"] is None:
        raise RuntimeError("your function ended the process it was measured in")
    result = _load(io.BytesIO(measured["child"].numpy().tobytes()), weights_only=True)
    if result["error"] is not None:  # the learner's exception, as a built-in type where it is one
        kind = getattr(builtins, str(result.get("type")), None)
        if not (isinstance(kind, type) and issubclass(kind, Exception)):
            kind = RuntimeError
        raise kind(result["error"])
    return result["output"], int(measured["added"])


def _run_tiled(obj: Any, case: Case) -> Any:
    """Call the learner's function (no attention kernel of PyTorch allowed); for the memory case, in a
    child process whose memory is measured from outside it (see ``_measured_call``). One measurement decides:
    what the process did before the call does not count (its peak is reset at the call; pages written in place
    count only in runs), and the solution's loop measured at most 1.3 MiB of the 4 MiB allowance in a process
    full of holes, over 60 measurements with both cores busy and another process churning memory."""
    if not case.data.get("memory"):
        with _RefuseAttentionCalls():
            return call_function(obj, case)
    return _measured_call(obj, case)


def _tiled_atol(v: View) -> float:
    """Scores in the hundreds are rounded at that scale, and exp passes the error on to the output."""
    query, key, value = v.x[:3]
    if v.data.get("memory"):  # a bound on the largest score, without the (large) score matrix
        largest = query.norm(dim=-1).max() * key.norm(dim=-1).max() / math.sqrt(query.shape[-1])
    else:
        largest = (query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])).abs().max()
    return float32_atol(largest * value.abs().max()) if v.args[0].dtype == torch.float32 else 1e-5


def _memory(v: View) -> str | None:
    added, (query, key), block = v.extra, v.args[:2], v.args[3]
    if added is None or added <= MEMORY_ALLOWANCE:
        return None
    full = query.shape[-2] * key.shape[-2] * query.element_size()
    return (f"your function used {added / 2**20:.0f} MiB of memory (what it allocated at its peak, or what it "
            f"wrote into buffers made before the call); the full score matrix takes {full / 2**20:.0f} MiB and a "
            f"tiled loop needs a few: compute scores one ({block}, {block}) tile at a time, never for all keys at "
            "once (in PyTorch, NumPy or anything else, and not into a buffer prepared in advance)")


def _unnormalised(v: View) -> torch.Tensor:
    """Tiled attention without the final division: the accumulators, sum_j exp(s_ij - max_i) v_j."""
    query, key, value = v.x[:3]
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    return torch.exp(scores - scores.amax(dim=-1, keepdim=True)) @ value


def _keys_up_to_query_length(v: View) -> torch.Tensor | None:
    """Attention over the key blocks that ``range(0, Lq, block)`` visits (fewer keys than there are, when
    Lq < Lk); ``None`` where that loop visits every key."""
    query, key, value = v.x[:3]
    seen = -(-query.shape[-2] // v.args[3]) * v.args[3]  # the block starts below Lq, each block long
    if seen >= key.shape[-2]:
        return None
    return F.scaled_dot_product_attention(query, key[..., :seen, :], value[..., :seen, :])


_TILED = Check(
    reference=lambda v: F.scaled_dot_product_attention(*v.x[:3]),
    mistakes=(Mistake(_unnormalised, "your output is the accumulator itself: divide each query block's "
                                     "accumulator by its running sum once its last key block is done"),
              Mistake(_keys_up_to_query_length, "your loop over key blocks runs over the number of queries, so "
                                                "it skips the keys past it (and meets empty blocks when there are "
                                                "fewer keys than queries): the key blocks must cover every key, "
                                                "up to the keys' own length")),
    outputs=(Out("output", "F.scaled_dot_product_attention", atol=_tiled_atol, dtype=lambda v: v.args[0].dtype),),
    unpack=second_run("memory", message="expected your function to return the output tensor"),
    after=(_memory,),
)


EXERCISE = with_texts(Exercise(  # title, summaries and hints: ex11.toml
    id="ex11", chapters=("11_efficient_attention", "11b_tiled_attention"), preamble=PREAMBLE,
    parts=(
        Part("cache_append", points=1, make_cases=_append_cases, verify=_APPEND),
        Part("online_softmax_update", points=2, make_cases=_online_cases, verify=_ONLINE),
        Part("tiled_attention_step", points=3, make_cases=_step_cases, verify=_STEP),
        Part("tiled_attention", points=3, make_cases=_tiled_cases, verify=_TILED, run=_run_tiled),
    ),
))
