"""VerifierPool: a thin Ray actor around one PythonSandbox (all logic lives in the core).

Several actors can share the load (e.g. round-robin over `VerifierPool.remote(...)` handles);
each reports `stats()` -- queue depth, latency and counts by status -- for metrics.
"""

from __future__ import annotations

import ray

from compassplay.verifiers.python_sandbox import ExecResult, PythonSandbox


@ray.remote
class VerifierPool:
    """Ray actor owning one pool of isolated Python workers."""

    def __init__(self, workers: int = 2, timeout_s: float = 5.0, memory_mb: int = 512,
                 max_output_bytes: int = 65536, **kwargs: object) -> None:
        self._sb = PythonSandbox(workers=workers, timeout_s=timeout_s, memory_mb=memory_mb,
                                 max_output_bytes=max_output_bytes, **kwargs)  # type: ignore[arg-type]
        self._sb.start()

    def run_many(self, codes: list[str], timeout_s: float | None = None) -> list[ExecResult]:
        return self._sb.run_many(codes, timeout_s)

    def run(self, code: str, timeout_s: float | None = None) -> ExecResult:
        return self._sb.run(code, timeout_s)

    def stats(self) -> dict:
        return {**self._sb.stats.snapshot(), "workers": self._sb.workers,
                "live_workers": self._sb.live_workers()}

    def close(self) -> None:
        self._sb.close()
