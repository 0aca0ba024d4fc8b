"""Client for one leanprover-community/repl process (JSON over stdin/stdout) and its verdicts.

    with LeanRepl(command=["lake", "env", "repl"], cwd=PROJECT_DIR, timeout_s=60) as repl:
        head = repl.send({"cmd": "import Mathlib"})                   # {"env": 0}
        resp = repl.send({"cmd": "theorem t : 1 + 1 = 2 := by decide", "env": head["env"]})
    v = lean_verdict(resp)   # LeanVerdict(accepted=True, status="accepted", errors=[], sorries=0)

Protocol: a request is one JSON object followed by a blank line; a response is read up to the
next blank line (the REPL pretty-prints, so it may span several lines). Every read waits with
select() on the pipe against a wall-clock deadline (works off the main thread, no signals); on a
timeout, EOF or malformed reply the whole process group is killed and a `LeanReplError`
subclass says why. Message, sorry and statement helpers live in `lean_messages.py`.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from compassplay.verifiers.lean.responses import (
    LeanMessage,
    LeanVerdict,
    check_statement_preserved,
    elaborates_with_sorry,
    lean_verdict,
    parse_messages,
)

__all__ = [
    "LeanCrash", "LeanMemory", "LeanMessage", "LeanProtocolError", "LeanRepl", "LeanReplError",
    "LeanTimeout", "LeanVerdict", "check_statement_preserved", "elaborates_with_sorry",
    "tree_rss_bytes", "lean_verdict", "parse_messages",
]

MEMORY_MARKERS = ("out of memory", "memoryerror", "std::bad_alloc", "cannot allocate memory")
_POLL_S = 0.05
_RSS_EVERY_S = 0.25


class LeanReplError(RuntimeError):
    """The REPL process is unusable (already killed when this is raised); `status` names why."""

    status = "crash"


class LeanTimeout(LeanReplError):
    status = "timeout"


class LeanCrash(LeanReplError):
    status = "crash"


class LeanMemory(LeanReplError):
    status = "memory"


class LeanProtocolError(LeanReplError):
    status = "protocol"


def _limit_address_space(limit_bytes: int) -> None:
    """preexec_fn: no imports or locks here (other threads may hold them at fork)."""
    resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out += [int(c) for c in fh.read().split()]
    except (OSError, ValueError):
        pass
    return out


def tree_rss_bytes(pid: int) -> int:
    """Resident memory (bytes) of `pid` and its descendants (`lake env repl` runs the REPL as
    a child), from /proc; 0 where /proc is unavailable."""
    page = os.sysconf("SC_PAGE_SIZE")
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/statm") as fh:
                total += int(fh.read().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue
        todo += _children(p)
    return total


class LeanRepl:
    """One REPL process in its own session (process group); not thread-safe (one caller)."""

    def __init__(self, command: Sequence[str], cwd: str | os.PathLike[str] | None = None,
                 timeout_s: float = 60.0, memory_mb: int = 0, rss_limit_mb: int = 0,
                 max_reply_bytes: int = 8 << 20, env: Mapping[str, str] | None = None) -> None:
        """`timeout_s`: default wall-clock limit per request (s); `memory_mb`: RLIMIT_AS of the
        process (MiB, 0 = none); `rss_limit_mb`: kill when the RSS of the process tree exceeds it
        while a request runs (MiB, 0 = none); `max_reply_bytes`: longest accepted response."""
        if isinstance(command, str) or not command or not all(isinstance(c, str) for c in command):
            raise TypeError(f"command must be a non-empty list of str, got {command!r}")
        if timeout_s <= 0 or memory_mb < 0 or rss_limit_mb < 0 or max_reply_bytes < 64:
            raise ValueError("need timeout_s > 0, memory_mb >= 0, rss_limit_mb >= 0, "
                             "max_reply_bytes >= 64")
        if cwd is not None and not os.path.isdir(cwd):
            raise FileNotFoundError(f"Lean project directory not found: {cwd}")
        self.command = list(command)
        self.timeout_s = float(timeout_s)
        self.rss_limit_bytes = int(rss_limit_mb) << 20
        self.max_reply_bytes = int(max_reply_bytes)
        self._buf = bytearray()
        self._log = tempfile.TemporaryFile()
        preexec = None
        if memory_mb:
            limit = int(memory_mb) << 20
            preexec = lambda: _limit_address_space(limit)  # noqa: E731
        self.proc = subprocess.Popen(
            self.command, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._log, start_new_session=True, close_fds=True,
            env=None if env is None else dict(env), preexec_fn=preexec,
        )

    # ------------------------------------------------------------------ requests
    def send(self, request: Mapping[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        """Send one request and return the raw response dict (may be an error response such as
        {"message": "Unknown environment."}). Raises LeanReplError subclasses, killing the
        process, on timeout, exit, memory exhaustion or a reply that is not one JSON object."""
        if not isinstance(request, Mapping):
            raise TypeError(f"request must be a JSON object (dict), got {type(request).__name__}")
        if not any(k in request for k in ("cmd", "tactic", "pickleTo", "unpickleEnvFrom")):
            raise ValueError(f"request has no 'cmd' or 'tactic' field: {sorted(request)}")
        body = json.dumps(dict(request), ensure_ascii=False)
        if not self.alive():
            self._fail(LeanCrash, "REPL process is not running")
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else float(timeout_s))
        try:
            self.proc.stdin.write(body.encode() + b"\n\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        except (BrokenPipeError, OSError) as exc:
            self._fail(LeanCrash, f"write to REPL failed: {exc}")
        raw = self._read_block(deadline)
        try:
            resp = json.loads(raw)
        except ValueError as exc:
            self._fail(LeanProtocolError, f"reply is not JSON ({exc}): {raw[:200]!r}")
        if not isinstance(resp, dict):
            self._fail(LeanProtocolError, f"reply is not a JSON object: {raw[:200]!r}")
        return resp

    def _read_block(self, deadline: float) -> str:
        """Bytes up to the next blank line, skipping blank lines before the block."""
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        next_rss = time.monotonic() + _RSS_EVERY_S
        while True:
            while self._buf[:1] in (b"\n", b"\r"):
                del self._buf[:1]
            end = self._buf.find(b"\n\n")
            if end < 0:
                end = self._buf.find(b"\r\n\r\n")
            if end >= 0:
                block = bytes(self._buf[:end])
                del self._buf[:end + 2]
                return block.decode("utf-8", errors="replace")
            if len(self._buf) > self.max_reply_bytes:
                self._fail(LeanProtocolError,
                           f"reply exceeds {self.max_reply_bytes} bytes without a blank line")
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail(LeanTimeout, "no reply before the deadline")
            ready, _, _ = select.select([fd], [], [], min(left, _POLL_S))
            if self.rss_limit_bytes and time.monotonic() >= next_rss:
                next_rss = time.monotonic() + _RSS_EVERY_S
                if tree_rss_bytes(self.proc.pid) > self.rss_limit_bytes:
                    self._fail(LeanMemory, f"RSS above {self.rss_limit_bytes >> 20} MiB")
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                self._fail_exited()
            self._buf += chunk

    def _fail_exited(self) -> None:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        tail = self.stderr_tail()
        cls = LeanMemory if any(m in tail.lower() for m in MEMORY_MARKERS) else LeanCrash
        self._fail(cls, f"REPL exited with code {code}: {tail[-500:]}")

    def _fail(self, cls: type[LeanReplError], why: str) -> None:
        self.kill()
        raise cls(why)

    # ------------------------------------------------------------------ lifecycle
    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_bytes(self) -> int:
        """Resident memory of the REPL process and its descendants (bytes)."""
        return tree_rss_bytes(self.proc.pid) if self.alive() else 0

    def stderr_tail(self, n: int = 2000) -> str:
        try:
            self._log.seek(0, os.SEEK_END)
            self._log.seek(max(0, self._log.tell() - n))
            return self._log.read().decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""

    def kill(self) -> None:
        """SIGKILL the whole process group and reap it; idempotent."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()  # type: ignore[union-attr]
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        """Close stdin (the REPL exits on EOF), then kill the group whatever happened."""
        if self.alive():
            try:
                self.proc.stdin.close()  # type: ignore[union-attr]
                self.proc.wait(timeout=2)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        self.kill()
        try:
            self._log.close()
        except OSError:
            pass

    def __enter__(self) -> LeanRepl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
