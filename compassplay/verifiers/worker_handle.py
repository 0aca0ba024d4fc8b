"""Host-side handle for one sandboxed zygote: start, bounded framed I/O, hard kill."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import struct
import subprocess
import tempfile
import time

from compassplay.verifiers import isolation


class WorkerDied(RuntimeError):
    """The zygote exited, broke protocol or missed its deadline; the handle is now dead."""


class WorkerHandle:
    """One long-lived sandbox running ``sandbox_worker.py``."""

    def __init__(self, mode: str, cfg: dict, tmpfs_mb: int, max_reply_bytes: int,
                 start_timeout_s: float = 30.0) -> None:
        self.mode = mode
        self.max_reply_bytes = max_reply_bytes
        self._scratch: str | None = None
        cfg = dict(cfg)
        if mode == isolation.UNSAFE_OPT_OUT:
            self._scratch = tempfile.mkdtemp(prefix="compassplay-unsafe-sandbox-")
            cfg["scratch_root"] = self._scratch
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            isolation.worker_command(mode, cfg, tmpfs_mb),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
            start_new_session=True, close_fds=True, env={} if mode == "bwrap" else None,
        )
        try:
            hello = self._read_frame(time.monotonic() + start_timeout_s, 4096)
        except WorkerDied as exc:
            detail = self._stderr_tail()
            self.kill()
            raise WorkerDied(f"sandbox worker failed to start: {exc}; {detail}") from None
        if not hello.get("ready"):
            self.kill()
            raise WorkerDied(f"unexpected hello from sandbox worker: {hello!r}")

    # ------------------------------------------------------------------ io
    def alive(self) -> bool:
        return self.proc.poll() is None

    def request(self, payload: dict, deadline: float) -> dict:
        """Send one request and wait for its reply until `deadline` (monotonic seconds)."""
        body = json.dumps(payload).encode()
        try:
            self.proc.stdin.write(struct.pack(">I", len(body)) + body)  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        except (BrokenPipeError, OSError) as exc:
            self.kill()
            raise WorkerDied(f"write failed: {exc}") from None
        return self._read_frame(deadline, self.max_reply_bytes)

    def _read_exact(self, n: int, deadline: float) -> bytes:
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise WorkerDied("deadline exceeded")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, min(n - len(buf), 1 << 20))
            if not chunk:
                self.kill()
                raise WorkerDied("sandbox worker exited")
            buf += chunk
        return bytes(buf)

    def _read_frame(self, deadline: float, max_bytes: int) -> dict:
        (size,) = struct.unpack(">I", self._read_exact(4, deadline))
        if size > max_bytes:
            self.kill()
            raise WorkerDied(f"reply of {size} bytes exceeds bound {max_bytes}")
        try:
            return json.loads(self._read_exact(size, deadline))
        except ValueError as exc:
            self.kill()
            raise WorkerDied(f"malformed reply: {exc}") from None

    # ------------------------------------------------------------------ lifecycle
    def _stderr_tail(self) -> str:
        try:
            self._log.seek(0, os.SEEK_END)
            size = self._log.tell()
            self._log.seek(max(0, size - 2000))
            return self._log.read().decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""

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
                body = json.dumps({"op": "exit"}).encode()
                self.proc.stdin.write(struct.pack(">I", len(body)) + body)  # type: ignore[union-attr]
                self.proc.stdin.flush()  # type: ignore[union-attr]
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
