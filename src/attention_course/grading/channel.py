"""The worker-to-grader channel: a pipe the grader owns, carrying length-prefixed frames under hard caps.

Each frame is a 4-byte big-endian length and that many bytes. The worker sends a JSON header frame per
step (``{"step": "cell", "cell": 3, "part": "..."}``) and, after a ``part_done`` header, one binary frame
with the part's outcomes (:func:`attention_course.grading.wire.encode` bytes, read by the grader with
:func:`attention_course.grading.wire.decode`, a parser of the wire's own types only).

The learner's code runs in the worker's process and can write to the pipe too, so the grader trusts
nothing here: :class:`FrameReader` refuses a frame longer than its cap, more frames or more bytes than the
job can need, and stops reading at the first violation; :func:`parse_header` accepts only a small flat
JSON object of known keys (a deeply nested line is a violation, not a ``RecursionError``). What the frames
mean, and which step may come next, is checked by :mod:`attention_course.grading.sandbox`.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from typing import Any

__all__ = ["FrameReader", "HEADER_LIMIT", "parse_header", "send_frame"]

HEADER_LIMIT = 16_384  # bytes of one header frame
_HEADER_KEYS = {"step": str, "cell": int, "part": str, "type": str, "message": str, "where": str, "pid": int,
                "size": int, "cpu": float}


def send_frame(fd: int, payload: bytes) -> None:
    """Write one frame (in the worker)."""
    data = struct.pack(">I", len(payload)) + payload
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def parse_header(payload: bytes) -> dict[str, Any] | None:
    """The header in ``payload``, or ``None`` when it is not a flat JSON object of known keys and types."""
    if len(payload) > HEADER_LIMIT:
        return None
    try:
        header = json.loads(payload.decode("utf-8"))
    except Exception:  # ValueError, UnicodeDecodeError, RecursionError: all the same to us
        return None
    if not isinstance(header, dict) or not isinstance(header.get("step"), str):
        return None
    for key, value in header.items():
        kind = _HEADER_KEYS.get(key)
        if kind is None or type(value) is not kind:
            return None
    return header


class FrameReader:
    """Reads frames from the grader's end of the channel in a thread, within caps.

    Args:
        fd: the read end of the pipe (closed by the reader when it stops).
        max_frames: frames accepted in all (set again with :meth:`allow` once the job is known).
        max_bytes: bytes accepted in all.
        blob_limit: bytes of one frame.
    """

    def __init__(self, fd: int, max_frames: int, max_bytes: int, blob_limit: int) -> None:
        self._fd = fd
        self._lock = threading.Condition()
        self._frames: list[bytes] = []
        self._max_frames = max_frames
        self._max_bytes = max_bytes
        self._blob_limit = blob_limit
        self._received_bytes = 0
        self.violation: str | None = None
        self.closed = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def allow(self, max_frames: int) -> None:
        """Accept up to ``max_frames`` frames in all (the grader knows the number once it sends the job)."""
        with self._lock:
            self._max_frames = max_frames

    def _read_exact(self, size: int) -> bytes | None:
        chunks, left = [], size
        while left:
            chunk = os.read(self._fd, min(left, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _run(self) -> None:
        try:
            while True:
                head = self._read_exact(4)
                if head is None:
                    break
                (size,) = struct.unpack(">I", head)
                with self._lock:
                    too_many = len(self._frames) + 1 > self._max_frames
                    too_big = size > self._blob_limit or self._received_bytes + size > self._max_bytes
                    if too_many or too_big:
                        self.violation = ("sent more messages than the job has steps" if too_many else
                                          f"sent a message of {size:,} bytes, over the channel's limit")
                        self._lock.notify_all()
                        break
                    self._received_bytes += size
                payload = self._read_exact(size)
                if payload is None:
                    break
                with self._lock:
                    self._frames.append(payload)
                    self._lock.notify_all()
        except OSError:
            pass
        finally:
            try:
                os.close(self._fd)
            except OSError:
                pass
            with self._lock:
                self.closed = True
                self._lock.notify_all()

    def take(self, start: int) -> list[bytes]:
        """Frames from index ``start`` on (frames are kept; callers remember how far they read)."""
        with self._lock:
            return self._frames[start:]

    def wait(self, count: int, timeout: float) -> bool:
        """Wait until at least ``count`` frames came, the channel closed or broke, or ``timeout`` passed."""
        with self._lock:
            return self._lock.wait_for(lambda: len(self._frames) >= count or self.closed or self.violation is not None,
                                       timeout=timeout)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
