"""A pool of pre-started, OS-isolated Python workers for running untrusted programs.

    with PythonSandbox(workers=2, timeout_s=5.0, memory_mb=512) as sb:
        r = sb.run("print(sum(range(10)))")   # ExecResult(status="ok", stdout="45\\n", ...)
        rs = sb.run_many([code1, code2])       # parallel, results in input order
        a, b = sb.run_many([code, code], hash_seeds=[0, 1])  # two string-hash seeds

Isolation (see `isolation.py` and `zygote.py`): one bubblewrap sandbox per worker
(own net/pid/mount/ipc/uts namespaces; a read-only root showing only the host's system
directories and the interpreter; size-limited tmpfs /tmp and /dev/shm; cleared env), in root
mode or, for ordinary users, rootless mode (unprivileged user namespace); inside it a warm
zygote forks a fresh child per run with rlimits and a seccomp filter (`sandbox_seccomp`).
Every run gets a new scratch directory and emptied, restored /tmp and /dev/shm
(`sandbox_scratch`); a worker that cannot restore them (or its own limits) retires and the runs
queued on it move to a fresh one. A run's memory is its RSS plus its files in /tmp and /dev/shm
plus its unix socket buffers plus 64 KiB per open fd (the most a pipe end holds: pipes cannot
grow) and per fd the user may have in flight over a unix socket; memfd, inotify and epoll
(kernel memory nothing counts) are refused. Timeouts are enforced by the zygote and, as a
backstop, by the host, which kills and restarts a worker that misses its deadline. Where the
machine delegates cgroup v2 memory, each worker also gets `memory.max`.

Zygotes are grouped by string-hash seed (PYTHONHASHSEED; `generations.py`): `hash_seed`
(default 0) starts with the pool; another seed gets its own zygotes the first time a run asks
for it, so a determinism check can run a program twice under two seeds (set iteration order
differs between them).
Throughput: each worker thread pipelines up to `pipeline_depth` requests to its zygote.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from compassplay.verifiers.sandbox import isolation
from compassplay.verifiers.sandbox.cgroup import CgroupMemory
from compassplay.verifiers.sandbox.generations import MAX_SEEDS, Generation, WorkerGenerations
from compassplay.verifiers.sandbox.isolation import UNSAFE_OPT_OUT, SandboxUnavailableError
from compassplay.verifiers.sandbox.stats import SandboxStats
from compassplay.verifiers.sandbox.worker_handle import WorkerDied, WorkerHandle, WorkerRetired

__all__ = ["ExecResult", "PythonSandbox", "SandboxUnavailableError", "UNSAFE_OPT_OUT"]

log = logging.getLogger(__name__)
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


@dataclass
class _Feed:
    """One worker's side of `SandboxPool._drain`: its handle, the jobs sent and not yet
    answered as (job index, send time), and when its previous reply came (time.monotonic s)."""

    handle: WorkerHandle
    inflight: deque[tuple[int, float]] = field(default_factory=deque)
    last: float = field(default_factory=time.monotonic)


class PythonSandbox(WorkerGenerations):
    """Thread-safe pool of isolated workers; use as a context manager or call close()."""

    def __init__(self, workers: int = 2, timeout_s: float = 5.0, memory_mb: int = 512,
                 max_output_bytes: int = 65536, isolation: str = "bwrap", nproc: int = 32,
                 file_size_mb: int = 16, tmpfs_mb: int = 64, host_grace_s: float = 5.0,
                 hash_seed: int = 0, pipeline_depth: int = 8, rootless_uid: int = 65534,
                 cgroup_memory: bool = True, wipe_budget_s: float = 1.0) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        isolation_mod.check_mode(isolation)
        self.workers = workers
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.max_output_bytes = int(max_output_bytes)
        self.isolation = isolation
        self.mode = isolation_mod.resolve(isolation)
        self.host_grace_s = host_grace_s
        self.tmpfs_mb = tmpfs_mb
        self.hash_seed = int(hash_seed)
        self.pipeline_depth = max(1, int(pipeline_depth))
        self.rootless_uid = int(rootless_uid)
        self.stats = SandboxStats()
        if not wipe_budget_s >= 0:
            raise ValueError("wipe_budget_s must be >= 0 seconds")
        # wipe_budget_s: seconds a zygote may spend removing a run's files; past it the worker
        # retires and a fresh one takes the next run
        self._limits = {"nproc": nproc, "fsize_mb": file_size_mb, "nofile": 256,
                        "wipe_budget_s": float(wipe_budget_s)}
        self._want_cgroup = cgroup_memory and self.mode != UNSAFE_OPT_OUT
        self._cgroup: CgroupMemory | None = None
        self._gens: dict[int, Generation] = {}
        self._gen_lock = threading.Lock()
        self._lock = threading.Lock()
        self._closed = True
        self._executor: ThreadPoolExecutor | None = None
        self._spawner: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def from_config(cls, cfg: Any) -> PythonSandbox:
        """Build (not start) from a `compassplay.config.VerifierSection`."""
        return cls(workers=cfg.workers, timeout_s=cfg.timeout_s, memory_mb=cfg.memory_mb,
                   max_output_bytes=cfg.max_output_bytes, isolation=cfg.isolation)

    def start(self) -> PythonSandbox:
        """Check isolation prerequisites and start every worker (raises if unavailable)."""
        if not self._closed:
            return self
        self.mode = isolation_mod.preflight(self.isolation, self.rootless_uid)
        if self.mode == UNSAFE_OPT_OUT:
            isolation_mod.warn_unsafe()
        if self._want_cgroup:
            self._cgroup = CgroupMemory()
        cgroup_note = self._cgroup.describe() if self._cgroup else "off: not requested"
        log.info("PythonSandbox: isolation=%s, cgroup v2 memory limit %s", self.mode, cgroup_note)
        self.stats.set_info(isolation=self.mode, cgroup_memory=cgroup_note)
        # bwrap --die-with-parent tracks the *thread* that forked it, so every spawn happens
        # on this pool-lifetime executor, never on a caller's (possibly short-lived) thread.
        self._spawner = ThreadPoolExecutor(max_workers=min(self.workers, 4),
                                           thread_name_prefix="sandbox-spawn")
        self._executor = ThreadPoolExecutor(max_workers=self.workers * MAX_SEEDS,
                                            thread_name_prefix="sandbox")
        self._closed = False
        try:
            self._generation(self.hash_seed)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop all workers; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        for gen in list(self._gens.values()):
            for i, h in enumerate(gen.slots):
                if h is not None:
                    h.close()
                gen.slots[i] = None
                CgroupMemory.remove(gen.cgroups[i])
        self._gens.clear()
        if self._spawner is not None:
            self._spawner.shutdown(wait=True)
            self._spawner = None

    def __enter__(self) -> PythonSandbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def uids(self) -> list[int]:
        """Host uids programs run as in root mode (empty in rootless/unsafe modes)."""
        return [u for g in list(self._gens.values()) for u in g.uids if u >= 0]

    def _handles(self) -> list[WorkerHandle]:
        return [h for g in list(self._gens.values()) for h in list(g.slots) if h is not None]

    def live_workers(self) -> int:
        """Number of worker sandboxes of the pool's own hash seed currently alive."""
        gen = self._gens.get(self.hash_seed)
        return sum(1 for h in list(gen.slots) if h is not None and h.alive()) if gen else 0

    def worker_pids(self) -> list[int]:
        """Host pids of the bwrap (or launcher) processes (for tests and diagnostics)."""
        return [h.proc.pid for h in self._handles()]

    # ------------------------------------------------------------------ running
    def run(self, code: str, timeout_s: float | None = None, hash_seed: int | None = None
            ) -> ExecResult:
        """Run one program in a fresh isolated child; never raises for program behaviour."""
        seeds = None if hash_seed is None else [hash_seed]
        return self.run_many([code], timeout_s, seeds)[0]

    def run_many(self, codes: list[str], timeout_s: float | None = None,
                 hash_seeds: list[int] | None = None) -> list[ExecResult]:
        """Run programs in parallel over the pool; results are in input order. `hash_seeds`
        (one per program) picks the PYTHONHASHSEED each runs under (default: `hash_seed`)."""
        if self._executor is None or self._closed:
            raise RuntimeError("PythonSandbox is not started (use `with` or .start())")
        if any(not isinstance(c, str) for c in codes):
            raise TypeError("code must be a str")
        if hash_seeds is not None and len(hash_seeds) != len(codes):
            raise ValueError("hash_seeds must have one seed per program")
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        groups: dict[int, deque[int]] = {}
        for i in range(len(codes)):
            seed = self.hash_seed if hash_seeds is None else int(hash_seeds[i])
            if not 0 <= seed <= 0xFFFFFFFF:
                raise ValueError(f"hash seed {seed} outside PYTHONHASHSEED's range 0..2**32-1")
            groups.setdefault(seed, deque()).append(i)
        results: list[ExecResult | None] = [None] * len(codes)
        self.stats.begin(len(codes))
        try:
            tasks = []
            for seed, jobs in groups.items():
                gen = self._generation(seed)
                n = min(self.workers, len(jobs))
                depth = min(self.pipeline_depth, -(-len(jobs) // n))  # keep every worker busy
                tasks += [(gen, jobs, depth)] * n
            if len(tasks) == 1:
                self._drain(*tasks[0], codes, results, timeout)
            else:
                futures = [self._executor.submit(self._drain, g, j, d, codes, results, timeout)
                           for g, j, d in tasks]
                for f in futures:
                    f.result()
        finally:
            missing = sum(1 for r in results if r is None)
            if missing:
                self.stats.cancel(missing)
        for i, r in enumerate(results):
            if r is None:  # every worker of its seed was lost and could not be restarted
                results[i] = ExecResult("killed", "", "sandbox worker unavailable", None, 0.0)
        return results  # type: ignore[return-value]

    def _finish(self, results: list, i: int, res: ExecResult, latency: float) -> None:
        results[i] = res
        self.stats.end(res.status, latency)

    def _drain(self, gen: Generation, jobs: deque[int], depth: int, codes: list[str],
               results: list, timeout: float) -> None:
        """Feed one worker of `gen` from the shared `jobs` until none are left: keep up to
        `depth` programs in flight (`_send_ahead`), record the oldest one's reply
        (`_take_reply`), and restart the worker when it dies or retires."""
        slot = gen.idle.get()
        try:
            handle = self._ensure_quiet(gen, slot)
            if handle is None:
                return  # this worker cannot be restarted: the others take the jobs
            feed = _Feed(handle)
            while True:
                self._send_ahead(feed, jobs, depth, codes, results, timeout)
                if not feed.inflight:
                    if jobs and not feed.handle.alive():  # died while idle: restart it
                        if not self._refeed(gen, slot, feed):
                            return
                        continue
                    return
                if not self._take_reply(gen, slot, feed, jobs, results, timeout):
                    return
        finally:
            gen.idle.put(slot)

    def _send_ahead(self, feed: _Feed, jobs: deque[int], depth: int, codes: list[str],
                    results: list, timeout: float) -> None:
        """Send jobs until `depth` are in flight, none are left, or the worker takes no more
        (its pipe is full, or it died: that job goes back to the front of `jobs`). A program
        over MAX_CODE_BYTES is answered at once with an error."""
        while len(feed.inflight) < depth:
            try:
                i = jobs.popleft()  # shared with the other workers' threads
            except IndexError:
                return
            data = codes[i].encode("utf-8", "surrogatepass")
            if len(data) > MAX_CODE_BYTES:
                self._finish(results, i, ExecResult("error", "", "program too large", None,
                                                    0.0), 0.0)
                continue
            if not feed.handle.can_send(len(data)):
                jobs.appendleft(i)
                return
            try:
                feed.handle.send(data, timeout, self.memory_mb, self.max_output_bytes)
            except WorkerDied:
                jobs.appendleft(i)
                return
            feed.inflight.append((i, time.monotonic()))

    def _take_reply(self, gen: Generation, slot: int, feed: _Feed, jobs: deque[int],
                    results: list, timeout: float) -> bool:
        """Wait for the oldest job's reply and record it. Its clock starts when it was sent
        or when the previous reply came, whichever is later (the worker runs one at a time).
        A retired worker ran none of the jobs in flight; a dead one lost the oldest (recorded
        as timeout, killed or memory) and never ran the rest: they go back to `jobs` and the
        worker restarts. False when it cannot be restarted."""
        i, sent = feed.inflight.popleft()
        begin = max(sent, feed.last)
        try:
            reply = feed.handle.recv(begin + timeout + self.host_grace_s)
        except WorkerRetired:  # it ran none of these: a fresh worker runs them
            return self._requeue_and_restart(gen, slot, feed, jobs, [i])
        except WorkerDied as exc:
            latency = time.monotonic() - begin
            status = "timeout" if latency >= timeout else "killed"
            if self._oom_since_last(gen, slot, feed.handle):
                status = "memory"
            self._finish(results, i, ExecResult(status, "", f"sandbox worker lost: {exc}", None,
                                                latency), latency)
            return self._requeue_and_restart(gen, slot, feed, jobs, [])
        feed.last = time.monotonic()
        status = reply.status
        if status in ("killed", "error") and self._oom_since_last(gen, slot, feed.handle):
            status = "memory"
        self._finish(results, i, ExecResult(
            status, reply.stdout.decode("utf-8", "replace"),
            reply.stderr.decode("utf-8", "replace"), reply.exit_code, reply.duration_s),
            feed.last - begin)
        return True

    def _requeue_and_restart(self, gen: Generation, slot: int, feed: _Feed, jobs: deque[int],
                             lost: list[int]) -> bool:
        """Put `lost` and the jobs still in flight back at the front of `jobs` (in order) and
        restart the worker; False when it cannot be restarted."""
        jobs.extendleft(reversed(lost + [j for j, _ in feed.inflight]))
        feed.inflight.clear()
        if not self._refeed(gen, slot, feed):  # killed: restarts
            return False
        feed.last = time.monotonic()
        return True

    def _refeed(self, gen: Generation, slot: int, feed: _Feed) -> bool:
        """A quiet worker in `slot` for `feed` (`_ensure_quiet`); False when there is none."""
        handle = self._ensure_quiet(gen, slot)
        if handle is None:
            return False
        feed.handle = handle
        return True


isolation_mod = isolation

