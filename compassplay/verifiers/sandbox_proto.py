"""Wire protocol between the host and a sandboxed zygote (stdlib only; also loaded inside).

Length-prefixed frames (4-byte big-endian length) on the zygote's stdin (requests) and stdout
(replies). A request is ``b"R"`` + REQ_HEAD (timeout_s, memory_mb, max_output_bytes) + the
program's UTF-8 source; ``b"X"`` asks the zygote to exit. The host may pipeline several
requests; replies come back in order, each REPLY_HEAD (status code, exit code, duration, rusage
CPU, peak RSS, output lengths) + stdout + stderr. The zygote greets with ``b"H"`` + HELLO.
A zygote that could not restore its fresh state after a run answers the next request with
RETIRE and exits: that request and every later one in flight never ran.
"""

from __future__ import annotations

import os
import struct

STATUSES = ("ok", "error", "timeout", "memory", "output_limit", "killed")
REQ_HEAD = struct.Struct(">dII")          # timeout_s, memory_mb, max_output_bytes
REPLY_HEAD = struct.Struct(">BBidddII")   # status, has_exit, exit, duration, cpu_s, peak_mb, out, err
HELLO = struct.Struct(">ii")              # zygote pid (1), uid programs run as
RETIRE = b"Q"  # instead of a reply: "not run, this worker is retiring, run it elsewhere"
LENGTH = struct.Struct(">I")
MAX_REQUEST = 8 * 1024 * 1024


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = os.read(fd, n)
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf if buf else None


def read_frame(fd: int) -> bytes | None:
    """One request body, or None at end of input."""
    head = _read_exact(fd, 4)
    if head is None:
        return None
    (size,) = LENGTH.unpack(head)
    if size > MAX_REQUEST:
        raise ValueError("request too large")
    return _read_exact(fd, size) if size else b""


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def frame(body: bytes) -> bytes:
    return LENGTH.pack(len(body)) + body
