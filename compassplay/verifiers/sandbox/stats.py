"""Thread-safe run bookkeeping for a sandbox pool (queue depth, latency, counts by status)."""

from __future__ import annotations

import threading
from collections import Counter, deque

STATUSES = ("ok", "error", "timeout", "memory", "output_limit", "killed")


class SandboxStats:
    """Counters a pool updates around every run; `snapshot()` is what metrics export."""

    def __init__(self, latency_window: int = 4096) -> None:
        self._lock = threading.Lock()
        self._in_flight = 0
        self._counts: Counter[str] = Counter({s: 0 for s in STATUSES})
        self._latencies: deque[float] = deque(maxlen=latency_window)
        self._total = 0
        self._restarts = 0
        self._info: dict[str, str] = {}

    def set_info(self, **info: str) -> None:
        """Static facts about the pool (isolation mode, cgroup memory limit) for the snapshot."""
        with self._lock:
            self._info.update(info)

    def begin(self, n: int = 1) -> None:
        with self._lock:
            self._in_flight += n

    def end(self, status: str, latency_s: float) -> None:
        with self._lock:
            self._in_flight -= 1
            self._counts[status] += 1
            self._latencies.append(latency_s)
            self._total += 1

    def cancel(self, n: int = 1) -> None:
        with self._lock:
            self._in_flight -= n

    def worker_restarted(self) -> None:
        with self._lock:
            self._restarts += 1

    def snapshot(self) -> dict:
        with self._lock:
            lat = sorted(self._latencies)
            counts = dict(self._counts)
            in_flight, total, restarts = self._in_flight, self._total, self._restarts
            info = dict(self._info)

        def pct(q: float) -> float:
            return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else 0.0

        return {
            **info,
            "queue_depth": in_flight,
            "runs_total": total,
            "counts": counts,
            "worker_restarts": restarts,
            "latency_s": {
                "mean": sum(lat) / len(lat) if lat else 0.0,
                "p50": pct(0.5),
                "p95": pct(0.95),
                "max": lat[-1] if lat else 0.0,
            },
        }
