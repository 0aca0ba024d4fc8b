"""The VerifierPool Ray actor runs programs in the sandbox pool and reports stats."""

from __future__ import annotations

import pytest

from tests.verifiers.sandbox_helpers import require_isolation


@pytest.mark.ray
def test_verifier_pool_actor_runs_and_reports() -> None:
    require_isolation()
    ray = pytest.importorskip("ray")
    from compassplay.actors.verifier_pool import VerifierPool

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        pools = [VerifierPool.options(max_concurrency=4).remote(workers=1, timeout_s=1.0)
                 for _ in range(2)]
        batches = [["print(40 + 2)", "1/0", "while True:\n    pass"], ["print('b')"]]
        results = ray.get([p.run_many.remote(b) for p, b in zip(pools, batches, strict=True)])
        assert [r.status for r in results[0]] == ["ok", "error", "timeout"]
        assert results[0][0].stdout == "42\n" and results[1][0].stdout == "b\n"
        stats = ray.get(pools[0].stats.remote())
        assert stats["runs_total"] == 3 and stats["queue_depth"] == 0
        assert stats["counts"]["timeout"] == 1 and stats["counts"]["ok"] == 1
        assert stats["live_workers"] == 1 and stats["latency_s"]["max"] >= 1.0
        ray.get([p.close.remote() for p in pools])
    finally:
        ray.shutdown()
