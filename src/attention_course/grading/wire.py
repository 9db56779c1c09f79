"""The wire form of a learner's output: plain data that can leave the learner's process safely.

Whatever the learner's function returns is converted by :func:`to_wire` (in the learner's process) into
plain ``torch.Tensor`` objects, Python numbers, strings, ``None`` and lists, tuples and dicts of these.
The worker sends a part's outcomes in this module's own byte format (:func:`encode`), and the grader reads
them with :func:`decode`: a reader of exactly these types and nothing else (no unpickler, no zip), with
limits on the structure (nesting, items, values, string and tensor sizes) checked before anything is
built, in time linear in the bytes that came. A learner who writes other bytes to the channel gets
"not the grader's format", and cannot make the grader's process run code or spend more than that. The
notebook check converts outputs the same way, so both see identical values.

The outcome of one call is a small dict (:func:`ok`, :func:`error`, :data:`NOT_IMPLEMENTED`), and
:func:`describe` turns any wire value into words for feedback messages.
"""

from __future__ import annotations

import struct
import sys
from typing import Any

import torch

__all__ = [
    "MAX_ELEMENTS",
    "NOT_IMPLEMENTED",
    "WireFormatError",
    "decode",
    "describe",
    "encode",
    "error",
    "is_wire",
    "ok",
    "outcome_of_call",
    "to_wire",
    "unsupported_type",
    "where",
]

#: Most elements a tensor may have on the wire (no exercise returns more); bigger outputs are refused, not shipped.
MAX_ELEMENTS = 5_000_000
_MAX_ITEMS = 1_000  # per list, tuple or dict
_MAX_DEPTH = 8
_MAX_STRING = 2_000
_UNSUPPORTED = "__unsupported_type__"

#: The wire form of a function that raised NotImplementedError (a part not attempted yet).
NOT_IMPLEMENTED: dict[str, str] = {"status": "not_implemented"}


def ok(value: Any) -> dict[str, Any]:
    """The outcome of a call that returned ``value`` (already in wire form)."""
    return {"status": "ok", "value": value}


def error(kind: str, message: str, where: str = "") -> dict[str, Any]:
    """The outcome of a call that raised: exception type name, message and where in the learner's code."""
    return {"status": "error", "type": kind[:200], "message": message[:_MAX_STRING], "where": where[:200]}


def unsupported_type(value: Any) -> str | None:
    """The type name recorded by :func:`to_wire` for an object it could not convert, else ``None``."""
    if isinstance(value, dict) and set(value) == {_UNSUPPORTED}:
        return str(value[_UNSUPPORTED])
    return None


def _type_name(obj: Any) -> str:
    cls = type(obj)
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", None) else f"{module}.{cls.__qualname__}"


def to_wire(obj: Any, _depth: int = 0) -> Any:
    """Convert ``obj`` into wire form: plain tensors (detached, on the CPU), numbers, strings, ``None``,
    and lists, tuples and dicts of these.

    Objects of other types become a marker naming their type (see :func:`unsupported_type`), so the
    verdict can say "expected a torch.Tensor, got numpy.ndarray" instead of failing to transfer.

    Raises:
        ValueError: a tensor with more than :data:`MAX_ELEMENTS` elements, or nesting deeper than 8 levels.
    """
    if _depth > _MAX_DEPTH:
        raise ValueError(f"output is nested more than {_MAX_DEPTH} levels deep")
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided or obj.dtype not in _DTYPE_CODES:
            return {_UNSUPPORTED: f"torch.Tensor ({obj.layout}, {obj.dtype})"}
        if obj.numel() > MAX_ELEMENTS:
            raise ValueError(f"output tensor has {obj.numel()} elements, more than the {MAX_ELEMENTS} allowed")
        # A plain, contiguous, CPU copy: no subclass, no autograd graph, no shared storage with learner code.
        plain = obj.detach().as_subclass(torch.Tensor).to("cpu").resolve_conj().resolve_neg()
        return plain.clone(memory_format=torch.contiguous_format).contiguous()
    if obj is None or type(obj) in (bool, int, float, str):
        return obj[:_MAX_STRING] if isinstance(obj, str) else obj
    if isinstance(obj, bool):
        return bool(obj)
    if isinstance(obj, float):  # e.g. numpy.float64, a float subclass
        return float(obj)
    if isinstance(obj, int):  # e.g. an IntEnum
        return int(obj)
    if type(obj).__module__ == "numpy" and hasattr(obj, "item") and getattr(obj, "shape", None) == ():
        return to_wire(obj.item(), _depth + 1)  # numpy scalars such as numpy.float32
    if isinstance(obj, (list, tuple)):
        if len(obj) > _MAX_ITEMS:
            raise ValueError(f"output has {len(obj)} items, more than the {_MAX_ITEMS} allowed")
        items = [to_wire(item, _depth + 1) for item in obj]
        return tuple(items) if isinstance(obj, tuple) else items
    if isinstance(obj, dict) and all(type(key) is str for key in obj) and len(obj) <= _MAX_ITEMS:
        return {key: to_wire(value, _depth + 1) for key, value in obj.items()}
    return {_UNSUPPORTED: _type_name(obj)}


#: Nodes (values, items) one :func:`is_wire` check visits at most: results share no structure that
#: could make the walk exponential (a list holding the same list a thousand times, nine levels deep).
_MAX_NODES = 200_000


def _plain_tensor(value: torch.Tensor) -> bool:
    """A dense, contiguous tensor that owns exactly its elements (what :func:`to_wire` sends): no
    zero-stride view that claims a trillion elements over one number, no offset into a bigger storage."""
    try:
        return (value.layout == torch.strided and not value.is_quantized and value.numel() <= MAX_ELEMENTS
                and value.is_contiguous() and value.storage_offset() == 0
                and value.untyped_storage().nbytes() == value.numel() * value.element_size())
    except Exception:
        return False


def is_wire(value: Any, _depth: int = 0, _budget: list[int] | None = None) -> bool:
    """Whether ``value`` contains only wire types (checked by the grader on everything it loads): plain
    tensors (dense, contiguous, owning exactly their elements), numbers, strings, ``None``, lists, tuples
    and dicts of at most 1,000 items, nested at most 9 deep, 200,000 values in all."""
    budget = [_MAX_NODES] if _budget is None else _budget
    budget[0] -= 1
    if budget[0] < 0 or _depth > _MAX_DEPTH + 1:
        return False
    if value is None or type(value) in (bool, int, float) or type(value) is str and len(value) <= _MAX_STRING * 2:
        return True
    if type(value) is torch.Tensor:
        return _plain_tensor(value)
    if type(value) in (list, tuple):
        return len(value) <= _MAX_ITEMS + 1 and all(is_wire(item, _depth + 1, budget) for item in value)
    if type(value) is dict:
        return len(value) <= _MAX_ITEMS + 1 and all(type(key) is str and is_wire(item, _depth + 1, budget)
                                                    for key, item in value.items())
    return False


def _is_learner_file(filename: str) -> bool:
    # Jupyter names cells /tmp/ipykernel_<pid>/<hash>.py (older IPython: <ipython-input-N-...>); the
    # grader's worker compiles them as <cell ...>.
    return "ipykernel_" in filename or filename.startswith(("<ipython-input", "<cell"))


def where(exc: BaseException, trusted: Any = None) -> str:
    """'line N of your <part> cell' (the grader's worker names cells ``<cell INDEX PART>``) or 'line N of
    your cell' for the innermost traceback frame in the learner's code, else ''.

    The walk reads only the traceback's own fields (file names, line numbers), so no learner code runs
    inside it; the worker's run-time guard (``attention_course.grading.import_guard``) lets this walk's code,
    and no other, read ``tb_frame``. ``trusted``: a function that runs the walk (``trusted(walk)``), for
    callers that need one; the worker passes none."""
    tb = sys.exc_info()[2] if sys.exc_info()[1] is exc else None
    if tb is None:
        try:
            tb = BaseException.__dict__["__traceback__"].__get__(exc)
        except Exception:
            return ""

    def walk() -> list[tuple[str, int]]:
        found = []
        node = tb
        while node is not None and len(found) < 1000:
            found.append((node.tb_frame.f_code.co_filename, node.tb_lineno))
            node = node.tb_next
        return found

    try:
        frames = trusted(walk) if trusted is not None else walk()
    except Exception:
        return ""
    for filename, lineno in reversed(frames):
        if not isinstance(filename, str) or not isinstance(lineno, int):
            continue
        if _is_learner_file(filename):
            words = filename.strip("<>").split()
            part = words[2] if len(words) == 3 and words[0] == "cell" and words[2].isidentifier() else None
            return f"line {lineno} of your {part} cell" if part else f"line {lineno} of your cell"
    return ""


def _text(value: Any, name: bool = False) -> str:
    """``str(value)`` (or its type's name), or a placeholder when the learner's class makes that raise."""
    try:
        return str(type(value).__name__ if name else value)
    except BaseException:
        return "(could not be shown)"


def outcome_of_call(thunk: Any, trusted: Any = None) -> dict[str, Any]:
    """Call ``thunk()`` and return its outcome dict; never raises. ``SystemExit`` and ``KeyboardInterrupt``
    become outcomes too: the learner's code must not end the checking. ``trusted``: see :func:`where`."""
    try:
        value = thunk()
    except NotImplementedError:
        return dict(NOT_IMPLEMENTED)
    except SystemExit as exc:
        code = exc.code
        return error("SystemExit", f"your code called sys.exit({_text(code if isinstance(code, int) else '...')})",
                     where(exc, trusted))
    except BaseException as exc:  # anything the learner's code raises is feedback, not a crash
        return error(_text(exc, name=True), _text(exc), where(exc, trusted))
    try:
        return ok(to_wire(value))
    except BaseException as exc:
        return error(_text(exc, name=True), f"could not read your output: {_text(exc)}")


def describe(value: Any) -> str:
    """Words for a wire value: 'a tensor of shape (2, 3) and dtype torch.float32', 'a tuple of 2 items'."""
    unsupported = unsupported_type(value)
    if unsupported is not None:
        return f"an object of type {unsupported}"
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    if value is None:
        return "None"
    if isinstance(value, (list, tuple, dict)):
        kind = type(value).__name__
        return f"a {kind} of {len(value)} item{'s' if len(value) != 1 else ''}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


# --- the byte format of a part's outcomes (worker -> grader) ---------------------------------------------
#: Tensor dtypes the wire carries, with their one-byte codes (an output of another dtype is "unsupported").
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32,
           torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128)
_DTYPE_CODES = {dtype: code for code, dtype in enumerate(_DTYPES)}
_MAGIC = b"ACW1"
_MAX_INT_DIGITS = 1_000
_MAX_STRING_BYTES = 4 * _MAX_STRING * 2  # UTF-8 of the longest string is_wire accepts
_MAX_DIMS = 16


class WireFormatError(ValueError):
    """Bytes that are not outcomes in the wire format, or that break one of its limits."""


def encode(value: Any) -> bytes:
    """``value`` (already in wire form, see :func:`to_wire`) as bytes for :func:`decode`.

    Raises:
        WireFormatError: a value that is not wire data (it was not converted by :func:`to_wire`).
    """
    chunks: list[bytes] = [_MAGIC]

    def put(obj: Any, depth: int) -> None:
        if depth > _MAX_DEPTH + 2:
            raise WireFormatError("nested too deeply")
        if obj is None:
            chunks.append(b"N")
        elif obj is True or obj is False:
            chunks.append(b"T" if obj else b"F")
        elif type(obj) is int:
            text = str(obj).encode() if abs(obj) < 10**_MAX_INT_DIGITS else None
            if text is None:
                put({_UNSUPPORTED: "int (more than 1,000 digits)"}, depth)
                return
            chunks.extend([b"i", struct.pack("<H", len(text)), text])
        elif type(obj) is float:
            chunks.extend([b"f", struct.pack("<d", obj)])
        elif type(obj) is str:
            text = obj.encode("utf-8", errors="replace")[:_MAX_STRING_BYTES]
            chunks.extend([b"s", struct.pack("<I", len(text)), text])
        elif type(obj) in (list, tuple):
            chunks.extend([b"l" if type(obj) is list else b"t", struct.pack("<I", len(obj))])
            for item in obj:
                put(item, depth + 1)
        elif type(obj) is dict:
            chunks.extend([b"d", struct.pack("<I", len(obj))])
            for key, item in obj.items():
                if type(key) is not str:
                    raise WireFormatError("a dict key that is not a string")
                text = key.encode("utf-8", errors="replace")[:_MAX_STRING_BYTES]
                chunks.extend([struct.pack("<I", len(text)), text])
                put(item, depth + 1)
        elif type(obj) is torch.Tensor and obj.dtype in _DTYPE_CODES and obj.layout == torch.strided:
            plain = obj.detach().resolve_conj().resolve_neg().contiguous()
            chunks.extend([b"X", struct.pack("<BBB", _DTYPE_CODES[plain.dtype], int(plain.requires_grad),
                                             plain.dim()), struct.pack(f"<{plain.dim()}Q", *plain.shape)])
            chunks.append(plain.reshape(-1).view(torch.uint8).numpy().tobytes() if plain.numel() else b"")
        else:
            raise WireFormatError(f"{type(obj).__name__} is not a wire type")

    put(value, 0)
    return b"".join(chunks)


def decode(data: bytes, max_nodes: int = _MAX_NODES) -> Any:
    """The value :func:`encode` wrote into ``data``, read by a parser of only the wire's own types: ``None``,
    booleans, ints of at most 1,000 digits, floats, strings, lists, tuples, dicts with string keys, and
    dense tensors of the wire's dtypes. Every limit is checked before anything is built: nesting (10
    levels), items per container (1,001), values in all (``max_nodes``), string bytes, tensor elements
    (:data:`MAX_ELEMENTS`, and the bytes they claim must be there). The work is linear in ``len(data)``.

    Raises:
        WireFormatError: anything else, with what was wrong.
    """
    view = memoryview(data)
    if bytes(view[:4]) != _MAGIC:
        raise WireFormatError("not the grader's wire format")
    position = 4
    nodes = 0

    def take(size: int) -> memoryview:
        nonlocal position
        if size < 0 or position + size > len(view):
            raise WireFormatError("ends early (a size claims more bytes than came)")
        chunk = view[position:position + size]
        position += size
        return chunk

    def text(size_format: str, limit: int) -> str:
        (size,) = struct.unpack(size_format, take(struct.calcsize(size_format)))
        if size > limit:
            raise WireFormatError(f"a string of {size:,} bytes (the limit is {limit:,})")
        return bytes(take(size)).decode("utf-8", errors="replace")

    def count() -> int:
        (size,) = struct.unpack("<I", take(4))
        if size > _MAX_ITEMS + 1:
            raise WireFormatError(f"a container of {size:,} items (the limit is {_MAX_ITEMS + 1:,})")
        return size

    def get(depth: int) -> Any:
        nonlocal nodes
        nodes += 1
        if nodes > max_nodes:
            raise WireFormatError(f"more than {max_nodes:,} values")
        if depth > _MAX_DEPTH + 1:
            raise WireFormatError(f"nested more than {_MAX_DEPTH + 1} levels")
        tag = bytes(take(1))
        if tag == b"N":
            return None
        if tag in (b"T", b"F"):
            return tag == b"T"
        if tag == b"i":
            digits = text("<H", _MAX_INT_DIGITS + 1)
            if not digits or not (digits.lstrip("-").isdigit() and digits.isascii()):
                raise WireFormatError("an int that is not a decimal number")
            return int(digits)
        if tag == b"f":
            return struct.unpack("<d", take(8))[0]
        if tag == b"s":
            return text("<I", _MAX_STRING_BYTES)
        if tag in (b"l", b"t"):
            items = [get(depth + 1) for _ in range(count())]
            return items if tag == b"l" else tuple(items)
        if tag == b"d":
            found: dict[str, Any] = {}
            for _ in range(count()):
                key = text("<I", _MAX_STRING_BYTES)
                found[key] = get(depth + 1)
            return found
        if tag == b"X":
            code, grad, dims = struct.unpack("<BBB", take(3))
            if code >= len(_DTYPES) or grad > 1 or dims > _MAX_DIMS:
                raise WireFormatError("a tensor of an unknown dtype or too many dimensions")
            shape = struct.unpack(f"<{dims}Q", take(8 * dims))
            numel = 1
            for size in shape:
                numel *= size
                if numel > MAX_ELEMENTS:
                    raise WireFormatError(f"a tensor of more than {MAX_ELEMENTS:,} elements")
            dtype = _DTYPES[code]
            size = numel * torch.empty((), dtype=dtype).element_size()
            raw = take(size)
            if numel == 0:
                return torch.empty(shape, dtype=dtype)
            return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)
        raise WireFormatError("an unknown type tag")

    try:
        value = get(0)
    except struct.error as exc:
        raise WireFormatError("ends early") from exc
    if position != len(view):
        raise WireFormatError("holds bytes after its value")
    return value
