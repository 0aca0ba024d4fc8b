"""Wire protocol between the host and a sandboxed zygote (stdlib only; also loaded inside).

Length-prefixed frames (4-byte big-endian length) on the zygote's stdin (requests) and stdout
(replies). A request is ``b"R"`` + REQ_HEAD (timeout_s, memory_mb, max_output_bytes) + the
program's UTF-8 source; ``b"X"`` asks the zygote to exit. The host may pipeline several
requests; replies come back in order, each REPLY_HEAD (status code, exit code, duration, rusage
CPU, peak RSS, output lengths) + stdout + stderr. The zygote greets with ``b"H"`` + HELLO.
A zygote that could not restore its fresh state after a run answers the next request with
RETIRE and exits: that request and every later one in flight never ran.

The zygote's side is batched (`Channel`): one read may bring several pipelined requests, and
replies wait (at most `MAX_HELD`, and never while the zygote would block: see `Channel`) to go
out several per write, so the host wakes once per batch rather than once per run.
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
MAX_HELD = 4  # replies held back at most, to go out in one write
READ_BYTES = 1 << 16


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def frame(body: bytes) -> bytes:
    return LENGTH.pack(len(body)) + body


class Channel:
    """The zygote's ends of the pipes: requests read ahead, replies written in batches.

    `reply` holds a reply back until `MAX_HELD` are waiting; `request` sends the held ones
    before it has to block for more input, and the zygote calls `flush` before anything that
    may take long (a run past its fast wait, a wipe, a sweep of leftovers). So a held reply is
    late by at most MAX_HELD - 1 short runs (under 0.1 s), far inside the host's grace."""

    def __init__(self, in_fd: int, out_fd: int, max_held: int = MAX_HELD) -> None:
        self.in_fd, self.out_fd, self.max_held = in_fd, out_fd, max_held
        self._buf = bytearray()
        self._pos = 0
        self._held: list[bytes] = []

    def request(self) -> bytes | None:
        """The next request body, or None at end of input."""
        while True:
            buf, pos = self._buf, self._pos
            need = 4
            if len(buf) - pos >= 4:
                size = int.from_bytes(buf[pos:pos + 4], "big")
                if size > MAX_REQUEST:
                    raise ValueError("request too large")
                need = 4 + size
                if len(buf) - pos >= need:
                    self._pos = pos + need
                    return bytes(buf[pos + 4:pos + need])
            self.flush()  # nothing left to run: the host gets every finished reply first
            del buf[:pos]
            self._pos = 0
            chunk = os.read(self.in_fd, max(READ_BYTES, need - len(buf)))
            if not chunk:
                return None
            buf += chunk

    def reply(self, frame_bytes: bytes) -> None:
        """Queue one reply frame (length prefix included)."""
        self._held.append(frame_bytes)
        if len(self._held) >= self.max_held:
            self.flush()

    def flush(self) -> None:
        """Write every held reply."""
        if self._held:
            write_all(self.out_fd, b"".join(self._held))
            self._held.clear()
