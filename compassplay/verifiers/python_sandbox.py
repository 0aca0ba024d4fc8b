"""A pool of pre-started, OS-isolated Python workers for running untrusted programs.

    with PythonSandbox(workers=2, timeout_s=5.0, memory_mb=512) as sb:
        r = sb.run("print(sum(range(10)))")   # ExecResult(status="ok", stdout="45\\n", ...)
        rs = sb.run_many([code1, code2])       # parallel, results in input order

Isolation (see `isolation.py` and `sandbox_worker.py`): one bubblewrap sandbox per worker
(own net/pid/mount/ipc/uts namespaces, read-only host root, tmpfs scratch, cleared env);
inside it a warm zygote forks a fresh child per run that drops to a per-worker
unprivileged uid with rlimits and a seccomp filter. Timeouts are enforced by the zygote and,
as a backstop, by the host, which kills and restarts a worker that misses its deadline.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from compassplay.verifiers import isolation
from compassplay.verifiers.isolation import UNSAFE_OPT_OUT, SandboxUnavailableError
from compassplay.verifiers.sandbox_stats import SandboxStats
from compassplay.verifiers.worker_handle import WorkerDied, WorkerHandle

__all__ = ["ExecResult", "PythonSandbox", "SandboxUnavailableError", "UNSAFE_OPT_OUT"]

MAX_CODE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one program: status is ok/error/timeout/memory/output_limit/killed."""

    status: str
    stdout: str
    stderr: str
    exit_code: int | None
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict:
        return asdict(self)


class PythonSandbox:
    """Thread-safe pool of isolated workers; use as a context manager or call close()."""

    def __init__(self, workers: int = 2, timeout_s: float = 5.0, memory_mb: int = 512,
                 max_output_bytes: int = 65536, isolation: str = "bwrap", nproc: int = 32,
                 file_size_mb: int = 16, tmpfs_mb: int = 64, host_grace_s: float = 5.0) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        _check_mode(isolation)
        self.workers = workers
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.max_output_bytes = int(max_output_bytes)
        self.isolation = isolation
        self.host_grace_s = host_grace_s
        self.tmpfs_mb = tmpfs_mb
        self.stats = SandboxStats()
        self.uids = _uids(isolation, workers)
        self._cfgs = [
            {"isolated": isolation == "bwrap", "uid": uid, "gid": uid, "nproc": nproc,
             "fsize_mb": file_size_mb, "nofile": 256, "seccomp": isolation == "bwrap",
             "loopback_down": True}
            for uid in self.uids
        ]
        self._slots: list[WorkerHandle | None] = [None] * workers
        self._idle: queue.Queue[int] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = True
        self._executor: ThreadPoolExecutor | None = None
        self._spawner: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> PythonSandbox:
        """Check isolation prerequisites and start every worker (raises if unavailable)."""
        if not self._closed:
            return self
        isolation_mod.preflight(self.isolation)
        if self.isolation == UNSAFE_OPT_OUT:
            isolation_mod.warn_unsafe()
        # bwrap --die-with-parent tracks the *thread* that forked it, so every spawn happens
        # on this pool-lifetime executor, never on a caller's (possibly short-lived) thread.
        self._spawner = ThreadPoolExecutor(max_workers=min(self.workers, 4),
                                           thread_name_prefix="sandbox-spawn")
        handles = list(self._spawner.map(self._spawn_safe, range(self.workers)))
        failed = [h for h in handles if isinstance(h, Exception)]
        if failed:
            for h in handles:
                if isinstance(h, WorkerHandle):
                    h.kill()
            self._spawner.shutdown(wait=True)
            self._spawner = None
            raise SandboxUnavailableError(f"could not start sandbox workers: {failed[0]}")
        self._slots = list(handles)  # type: ignore[arg-type]
        for i in range(self.workers):
            self._idle.put(i)
        self._executor = ThreadPoolExecutor(max_workers=self.workers,
                                            thread_name_prefix="sandbox")
        self._closed = False
        return self

    def close(self) -> None:
        """Stop all workers; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        for i, h in enumerate(self._slots):
            if h is not None:
                h.close()
            self._slots[i] = None
        if self._spawner is not None:
            self._spawner.shutdown(wait=True)
            self._spawner = None

    def __enter__(self) -> PythonSandbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def live_workers(self) -> int:
        """Number of worker sandboxes currently alive (should equal `workers`)."""
        return sum(1 for h in list(self._slots) if h is not None and h.alive())

    def worker_pids(self) -> list[int]:
        """Host pids of the bwrap processes (for tests and diagnostics)."""
        return [h.proc.pid for h in list(self._slots) if h is not None]

    # ------------------------------------------------------------------ running
    def run(self, code: str, timeout_s: float | None = None) -> ExecResult:
        """Run one program in a fresh isolated child; never raises for program behaviour."""
        if self._closed:
            raise RuntimeError("PythonSandbox is not started (use `with` or .start())")
        if not isinstance(code, str):
            raise TypeError("code must be a str")
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        self.stats.begin()
        start = time.monotonic()
        try:
            if len(code.encode("utf-8", "surrogatepass")) > MAX_CODE_BYTES:
                result = ExecResult("error", "", "program too large", None, 0.0)
            else:
                result = self._run_on_worker(code, timeout, start)
        except BaseException:
            self.stats.cancel()
            raise
        self.stats.end(result.status, time.monotonic() - start)
        return result

    def run_many(self, codes: list[str], timeout_s: float | None = None) -> list[ExecResult]:
        """Run programs in parallel over the pool; results are in input order."""
        if self._executor is None or self._closed:
            raise RuntimeError("PythonSandbox is not started (use `with` or .start())")
        return list(self._executor.map(lambda c: self.run(c, timeout_s), codes))

    def _run_on_worker(self, code: str, timeout: float, start: float) -> ExecResult:
        slot = self._idle.get()
        try:
            handle = self._ensure(slot)
            payload = {"code": code, "timeout_s": timeout, "memory_mb": self.memory_mb,
                       "max_output_bytes": self.max_output_bytes}
            try:
                reply = handle.request(payload, start + timeout + self.host_grace_s)
            except WorkerDied as exc:
                try:
                    self._restart(slot)
                except Exception:  # retried by _ensure() on the next run of this slot
                    self._slots[slot] = None
                elapsed = time.monotonic() - start
                status = "timeout" if elapsed >= timeout else "killed"
                return ExecResult(status, "", f"sandbox worker lost: {exc}", None, elapsed)
            return ExecResult(
                status=str(reply["status"]), stdout=str(reply["stdout"]),
                stderr=str(reply["stderr"]), exit_code=reply.get("exit_code"),
                duration_s=float(reply.get("duration_s", time.monotonic() - start)),
            )
        finally:
            self._idle.put(slot)

    # ------------------------------------------------------------------ workers
    def _spawn(self, slot: int) -> WorkerHandle:
        max_reply = 8 * self.max_output_bytes + 65536
        return WorkerHandle(self.isolation, self._cfgs[slot], self.tmpfs_mb, max_reply)

    def _spawn_safe(self, slot: int) -> WorkerHandle | Exception:
        try:
            return self._spawn(slot)
        except Exception as exc:  # reported by start()
            return exc

    def _ensure(self, slot: int) -> WorkerHandle:
        handle = self._slots[slot]
        if handle is None or not handle.alive():
            self._restart(slot)
            handle = self._slots[slot]
        assert handle is not None
        return handle

    def _restart(self, slot: int) -> None:
        old = self._slots[slot]
        if old is not None:
            old.kill()
        self._slots[slot] = None
        self.stats.worker_restarted()
        if not self._closed and self._spawner is not None:
            self._slots[slot] = self._spawner.submit(self._spawn, slot).result()


isolation_mod = isolation


def _check_mode(mode: str) -> None:
    if mode not in isolation.ISOLATION_MODES:
        raise ValueError(
            f"isolation must be 'bwrap' or the explicit opt-out {UNSAFE_OPT_OUT!r}, got {mode!r}"
        )


def _uids(mode: str, n: int) -> list[int]:
    return isolation.allocate_uids(n) if mode == "bwrap" else [-1] * n
