"""Soak: thousands of runs through one pool with flat host and zygote memory."""

from __future__ import annotations

import os

import pytest

from compassplay.verifiers.sandbox.pool import PythonSandbox
from tests.verifiers.sandbox_helpers import descendants, processes_of, require_isolation, rss_kb

MIX = [
    "print(sum(range(100)))",
    "d = {i: str(i) for i in range(200)}\nprint(len(d))",
    "raise KeyError('x')",
    "print('z' * 5000)",
    "import os\nopen('scratch.bin', 'wb').write(os.urandom(10000))\nprint('w')",
]


@pytest.mark.slow
def test_soak_memory_stays_flat() -> None:
    require_isolation()
    with PythonSandbox(workers=2, timeout_s=5.0, max_output_bytes=1024) as sb:
        for _ in range(3):
            sb.run_many(MIX * 60)
        host0 = rss_kb(os.getpid())
        zyg0 = {p: rss_kb(p) for w in sb.worker_pids() for p in descendants(w)}
        total, statuses = 0, {}
        for _ in range(10):
            for r in sb.run_many(MIX * 60):
                statuses[r.status] = statuses.get(r.status, 0) + 1
                total += 1
        host1 = rss_kb(os.getpid())
        zyg1 = {p: rss_kb(p) for w in sb.worker_pids() for p in descendants(w)}
        assert total == 3000
        assert statuses == {"ok": 1800, "error": 600, "output_limit": 600}
        assert host1 - host0 < 20_000, (host0, host1)
        assert set(zyg1) == set(zyg0), "a worker was restarted during the soak"
        for pid, kb in zyg1.items():
            assert kb - zyg0[pid] < 8_000, (pid, zyg0[pid], kb)
        assert sb.live_workers() == 2 and sb.stats.snapshot()["worker_restarts"] == 0
        assert processes_of(sb.uids) == []
