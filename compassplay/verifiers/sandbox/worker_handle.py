"""Host-side handle for one sandboxed zygote: start, pipelined binary frames, hard kill."""

from __future__ import annotations

import fcntl
import os
import select
import shutil
import signal
import struct
import subprocess
import tempfile
import time
from collections import deque
from dataclasses import dataclass

from compassplay.verifiers.sandbox import isolation
from compassplay.verifiers.sandbox.cgroup import CgroupMemory
from compassplay.verifiers.sandbox.proto import (
    HELLO,
    REPLY_HEAD,
    REQ_HEAD,
    RETIRE,
    STATUSES,
    write_all,
)

PIPE_BYTES = 1 << 20        # asked for with F_SETPIPE_SZ; pipelining stays below the real size
_F_SETPIPE_SZ = 1031


class WorkerDied(RuntimeError):
    """The zygote exited, broke protocol or missed its deadline; the handle is now dead."""


class WorkerRetired(WorkerDied):
    """The zygote could not restore its fresh state after a run and exited without running the
    request (nor any later one in flight): run them on a fresh worker."""


@dataclass(frozen=True)
class Reply:
    """One run as the zygote (the supervisor) saw it."""

    status: str
    exit_code: int | None
    duration_s: float
    cpu_s: float
    peak_mb: float
    stdout: bytes
    stderr: bytes


class WorkerHandle:
    """One long-lived sandbox running the zygote; requests may be pipelined (`send` several,
    then `recv` in order) as long as `can_send` allows, so the zygote never waits for us."""

    def __init__(self, mode: str, cfg: dict, tmpfs_mb: int, max_reply_bytes: int,
                 start_timeout_s: float = 30.0, hash_seed: int = 0, rootless_uid: int = 65534,
                 cgroup: str | None = None) -> None:
        self.mode = mode
        self.max_reply_bytes = max_reply_bytes
        self.cgroup = cgroup
        self.hash_seed = hash_seed
        self._scratch: str | None = None
        self._inflight: deque[int] = deque()
        self._inflight_bytes = 0
        self._buf = bytearray()
        cfg = dict(cfg)
        if mode == isolation.UNSAFE_OPT_OUT:
            self._scratch = tempfile.mkdtemp(prefix="compassplay-unsafe-sandbox-")
            cfg["scratch_root"] = self._scratch
        cmd, env = isolation.spawn_command(mode, isolation.zygote_argv(cfg), tmpfs_mb=tmpfs_mb,
                                           hash_seed=hash_seed, rootless_uid=rootless_uid,
                                           cgroup=cgroup)
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, start_new_session=True, close_fds=True,
                                     env=env, cwd="/", bufsize=0)
        self._in = self.proc.stdin.fileno()  # type: ignore[union-attr]
        self._out = self.proc.stdout.fileno()  # type: ignore[union-attr]
        self.pipe_bytes = 65536
        try:
            fcntl.fcntl(self._in, _F_SETPIPE_SZ, PIPE_BYTES)
            self.pipe_bytes = fcntl.fcntl(self._in, 1032)  # F_GETPIPE_SZ
        except OSError:
            pass
        try:
            write_all(self._in, isolation.bootstrap_frames())
            hello = self._read_frame(time.monotonic() + start_timeout_s, 4096)
        except (WorkerDied, OSError) as exc:
            detail = self._stderr_tail()
            self.kill()
            raise WorkerDied(f"sandbox worker failed to start: {exc}; {detail}") from None
        if hello[:1] != b"H" or len(hello) != 1 + HELLO.size:
            self.kill()
            raise WorkerDied(f"unexpected hello from sandbox worker: {hello[:64]!r}")
        self.inner_pid, self.uid = HELLO.unpack_from(hello, 1)

    # ------------------------------------------------------------------ io
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def can_send(self, code_bytes: int) -> bool:
        """True when a request of this size fits without risking a blocked write."""
        if not self._inflight:
            return True
        return self._inflight_bytes + code_bytes + 64 <= self.pipe_bytes // 2

    def send(self, code: bytes, timeout_s: float, memory_mb: int, max_output_bytes: int) -> None:
        body = b"R" + REQ_HEAD.pack(timeout_s, memory_mb, max_output_bytes) + code
        data = struct.pack(">I", len(body)) + body
        try:
            write_all(self._in, data)
        except OSError as exc:
            self.kill()
            raise WorkerDied(f"write failed: {exc}") from None
        self._inflight.append(len(data))
        self._inflight_bytes += len(data)

    def recv(self, deadline: float) -> Reply:
        """The reply to the oldest request in flight, or WorkerDied after `deadline`."""
        body = self._read_frame(deadline, self.max_reply_bytes)
        self._inflight_bytes -= self._inflight.popleft()
        if body == RETIRE:
            self.kill()
            raise WorkerRetired("sandbox worker retired: its state could not be restored")
        if len(body) < REPLY_HEAD.size:
            self.kill()
            raise WorkerDied(f"malformed reply of {len(body)} bytes")
        st, has_exit, code, dur, cpu, peak, n_out, n_err = REPLY_HEAD.unpack_from(body)
        if st >= len(STATUSES) or REPLY_HEAD.size + n_out + n_err != len(body):
            self.kill()
            raise WorkerDied("malformed reply")
        out = body[REPLY_HEAD.size:REPLY_HEAD.size + n_out]
        err = body[REPLY_HEAD.size + n_out:]
        return Reply(STATUSES[st], code if has_exit else None, dur, cpu, peak, out, err)

    def _take(self, n: int, deadline: float) -> bytes:
        """Exactly n bytes from the zygote (reading ahead into `_buf`), or WorkerDied."""
        buf = self._buf
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise WorkerDied("deadline exceeded")
            ready, _, _ = select.select([self._out], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._out, max(n - len(buf), 1 << 16))
            if not chunk:
                self.kill()
                raise WorkerDied("sandbox worker exited")
            buf += chunk
        data = bytes(buf[:n])
        del buf[:n]
        return data

    def _read_frame(self, deadline: float, max_bytes: int) -> bytes:
        (size,) = struct.unpack(">I", self._take(4, deadline))
        if size > max_bytes:
            self.kill()
            raise WorkerDied(f"reply of {size} bytes exceeds bound {max_bytes}")
        return self._take(size, deadline)

    # ------------------------------------------------------------------ lifecycle
    def _stderr_tail(self) -> str:
        try:
            self._log.seek(0, os.SEEK_END)
            size = self._log.tell()
            self._log.seek(max(0, size - 2000))
            return self._log.read().decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""

    def oom_kills(self) -> int:
        return CgroupMemory.oom_kills(self.cgroup)

    def kill(self) -> None:
        """Kill the whole sandbox (its pid namespace dies with bwrap) and reap it."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._cleanup()

    def close(self) -> None:
        """Ask the zygote to exit; kill it if it does not."""
        if self.proc.poll() is None:
            try:
                os.write(self._in, struct.pack(">I", 1) + b"X")
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def _cleanup(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout, self._log):
            try:
                stream.close()  # type: ignore[union-attr]
            except (OSError, ValueError):
                pass
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
