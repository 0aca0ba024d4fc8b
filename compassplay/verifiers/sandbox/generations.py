"""The zygote workers of a `PythonSandbox`, grouped by string-hash seed: `Generation` (one
seed's workers, their uids and cgroups) and `WorkerGenerations`, the sandbox's methods that
start a seed's workers, spawn one, restart a lost one and read its cgroup's OOM kills."""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from compassplay.verifiers.sandbox import isolation as isolation_mod
from compassplay.verifiers.sandbox.cgroup import CgroupMemory
from compassplay.verifiers.sandbox.isolation import UNSAFE_OPT_OUT, SandboxUnavailableError
from compassplay.verifiers.sandbox.stats import SandboxStats
from compassplay.verifiers.sandbox.worker_handle import WorkerHandle

log = logging.getLogger(__name__)
MAX_SEEDS = 4
CGROUP_HEADROOM_MB = 64  # the zygote and bwrap themselves, on top of one run's memory_mb


@dataclass
class Generation:
    """The zygotes of one hash seed: a slot per worker, an idle queue, their uids/cgroups."""

    seed: int
    uids: list[int]
    slots: list[WorkerHandle | None]
    cgroups: list[str | None]
    idle: queue.Queue = field(default_factory=queue.Queue)
    ooms: list[int] = field(default_factory=list)


class WorkerGenerations:
    """`PythonSandbox`'s worker management (a base class: the attributes below are the
    sandbox's, set in its `__init__` and `start`)."""

    workers: int
    mode: str
    memory_mb: int
    max_output_bytes: int
    tmpfs_mb: int
    rootless_uid: int
    stats: SandboxStats
    _limits: dict
    _cgroup: CgroupMemory | None
    _gens: dict[int, Generation]
    _gen_lock: threading.Lock
    _closed: bool
    _spawner: ThreadPoolExecutor | None

    def _generation(self, seed: int) -> Generation:
        with self._gen_lock:
            gen = self._gens.get(seed)
            if gen is not None:
                return gen
            if len(self._gens) >= MAX_SEEDS:
                raise ValueError(f"at most {MAX_SEEDS} distinct hash seeds per pool")
            n = self.workers
            uids = isolation_mod.allocate_uids(n) if self.mode == isolation_mod.ROOT else [-1] * n
            cgroups = [self._cgroup.create((self.memory_mb + CGROUP_HEADROOM_MB) << 20)
                       if self._cgroup else None for _ in range(n)]
            gen = Generation(seed, uids, [None] * n, cgroups, ooms=[0] * n)
            assert self._spawner is not None
            handles = list(self._spawner.map(lambda s: self._spawn_safe(gen, s), range(n)))
            failed = [h for h in handles if isinstance(h, Exception)]
            if failed:
                for h in handles:
                    if isinstance(h, WorkerHandle):
                        h.kill()
                for path in cgroups:
                    CgroupMemory.remove(path)
                raise SandboxUnavailableError(f"could not start sandbox workers: {failed[0]}")
            gen.slots = list(handles)  # type: ignore[arg-type]
            for i in range(n):
                gen.idle.put(i)
            self._gens[seed] = gen
            return gen

    def _spawn(self, gen: Generation, slot: int) -> WorkerHandle:
        cfg = {"isolated": self.mode != UNSAFE_OPT_OUT, "setuid": self.mode == isolation_mod.ROOT,
               "uid": gen.uids[slot], "gid": gen.uids[slot], "seccomp": self.mode != UNSAFE_OPT_OUT,
               "loopback_down": self.mode == isolation_mod.ROOT, **self._limits}
        max_reply = 8 * self.max_output_bytes + 65536
        return WorkerHandle(self.mode, cfg, self.tmpfs_mb, max_reply, hash_seed=gen.seed,
                            rootless_uid=self.rootless_uid, cgroup=gen.cgroups[slot])

    def _spawn_safe(self, gen: Generation, slot: int) -> WorkerHandle | Exception:
        try:
            return self._spawn(gen, slot)
        except Exception as exc:  # reported by _generation()
            return exc

    def _ensure_quiet(self, gen: Generation, slot: int) -> WorkerHandle | None:
        """A live worker in `slot`, restarting it if needed; None if that fails (logged; the
        next run on this slot tries again)."""
        handle = gen.slots[slot]
        if handle is not None and handle.alive():
            return handle
        try:
            return self._restart(gen, slot)
        except Exception as exc:  # noqa: BLE001 - reported, and retried on the next run
            log.warning("sandbox worker %d (hash seed %d) could not be restarted: %s",
                        slot, gen.seed, exc)
            return None

    def _restart(self, gen: Generation, slot: int) -> WorkerHandle:
        old = gen.slots[slot]
        if old is not None:
            old.kill()
        gen.slots[slot] = None
        self.stats.worker_restarted()
        if self._closed or self._spawner is None:
            raise RuntimeError("PythonSandbox is closed")
        handle = self._spawner.submit(self._spawn, gen, slot).result()
        gen.ooms[slot] = handle.oom_kills()
        gen.slots[slot] = handle
        return handle

    @staticmethod
    def _oom_since_last(gen: Generation, slot: int, handle: WorkerHandle) -> bool:
        """True when the worker's cgroup recorded an OOM kill since we last looked."""
        if handle.cgroup is None:
            return False
        n = handle.oom_kills()
        seen, gen.ooms[slot] = gen.ooms[slot], n
        return n > seen
