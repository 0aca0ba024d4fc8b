"""LeanPool against the stand-in REPL: header caching, concurrency and every failure mode."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from compassplay.config import load_config
from compassplay.verifiers.lean.repl_pool import LeanCheck, LeanPool, LeanUnavailableError

FAKE = [sys.executable, str(Path(__file__).parents[1] / "fake_lean_repl.py")]
OK = "theorem t : 1 + 1 = 2 := by decide"


@pytest.fixture()
def pool() -> Iterator[LeanPool]:
    with LeanPool(FAKE, processes=2, timeout_s=1.0, header_timeout_s=10) as p:
        yield p


def _statuses(verdicts: list) -> list[str]:
    return [v.status for v in verdicts]


def test_checks_reuse_the_header_environment(pool: LeanPool) -> None:
    reqs = [OK, "theorem z (n : ℕ) : n + 0 = n := by sorry", "theorem f : 1 = 2 := by exact foo",
            LeanCheck("theorem g : 2 = 2 := rfl", header="import Mathlib.Tactic")]
    assert _statuses(pool.check_many(reqs)) == ["accepted", "sorry", "error", "accepted"]
    # 6 more checks of the default header on 2 processes: env ids only grow by one per proof,
    # i.e. no process ran `import Mathlib` twice.
    assert all(v.accepted for v in pool.check_many([OK] * 6))
    s = pool.stats()
    assert s["checks_total"] == 10 and s["counts"]["accepted"] == 8 and s["backlog"] == 0
    assert s["restarts"] == 0 and s["live_processes"] == 2
    headers = [set(slot.envs) for slot in pool._slots]
    assert sum("import Mathlib" in h for h in headers) <= 2


def test_checks_run_concurrently(pool: LeanPool) -> None:
    t0 = time.monotonic()
    verdicts = pool.check_many([f"FAKE_SLOW:0.6 {OK}"] * 4)
    took = time.monotonic() - t0
    assert all(v.accepted for v in verdicts)
    assert took < 2.2, f"4 x 0.6 s on 2 processes took {took:.2f} s"


def test_hang_times_out_kills_and_restarts(pool: LeanPool) -> None:
    before = set(pool.pids())
    t0 = time.monotonic()
    v = pool.check("FAKE_HANG")
    assert v.status == "timeout" and not v.accepted and time.monotonic() - t0 < 3
    assert len(pool.pids()) == 1 and set(pool.pids()) < before  # the hung group is gone
    assert all(v.accepted for v in pool.check_many([OK, OK, OK]))
    # two concurrent checks need both processes: the killed one is restarted for them
    assert all(v.accepted for v in pool.check_many([f"FAKE_SLOW:0.3 {OK}"] * 2))
    s = pool.stats()
    assert s["restarts"] == 1 and s["counts"]["timeout"] == 1 and s["live_processes"] == 2


@pytest.mark.parametrize("magic,status", [("FAKE_CRASH", "crash"), ("FAKE_GARBAGE", "protocol")])
def test_crash_and_garbage_are_verdicts(pool: LeanPool, magic: str, status: str) -> None:
    verdicts = pool.check_many([magic, OK])
    assert _statuses(verdicts) == [status, "accepted"]
    assert pool.check(OK).accepted
    assert pool.stats()["counts"][status] == 1


def test_memory_limits_are_verdicts() -> None:
    with LeanPool(FAKE, processes=1, timeout_s=20, memory_mb=300) as p:
        assert p.check("FAKE_OOM").status == "memory"
        assert p.check(OK).accepted and p.stats()["restarts"] == 1
    with LeanPool(FAKE, processes=1, timeout_s=20, rss_limit_mb=120) as p:
        v = p.check("FAKE_GROW:200 FAKE_SLOW:5 theorem t : 1 = 1 := rfl")
        assert v.status == "memory" and "RSS" in v.errors[0]
        assert p.check(OK).accepted


def test_huge_output_is_handled() -> None:
    with LeanPool(FAKE, processes=1, timeout_s=10, max_reply_bytes=1 << 20) as p:
        big = p.check(f"FAKE_HUGE:500000 {OK}")
        assert big.accepted  # an info message of 500 kB is fine
        v = p.check(f"FAKE_HUGE:3000000 {OK}")
        assert v.status == "protocol" and "exceeds" in v.errors[0]
        assert p.check(OK).accepted
        v = p.check(f"FAKE_STDERR {OK}")  # 120 kB on stderr never blocks the pipe
        assert v.accepted


def test_recycling_by_uses_and_rss() -> None:
    with LeanPool(FAKE, processes=1, timeout_s=10, max_uses=3) as p:
        pids = set()
        for _ in range(7):
            assert p.check(OK).accepted
            pids.update(p.pids())
        s = p.stats()
        assert s["recycles"] == 2 and s["restarts"] == 0 and len(pids) == 3
    with LeanPool(FAKE, processes=1, timeout_s=10, recycle_rss_mb=100) as p:
        assert p.check(f"FAKE_GROW:150 {OK}").accepted
        assert p.stats()["recycles"] == 1 and p.check(OK).accepted


def test_header_errors_and_target_statements(pool: LeanPool) -> None:
    v = pool.check(LeanCheck(OK, header="import NopeLib"))
    assert v.status == "header_error" and "NopeLib" in v.errors[0]
    target = "theorem t : 1 + 1 = 2 := by sorry"
    good = LeanCheck(OK, target=target)
    cheat = LeanCheck("theorem t : True := trivial", target=target)
    assert _statuses(pool.check_many([good, cheat])) == ["accepted", "statement_changed"]


def test_bad_requests_raise_before_running(pool: LeanPool) -> None:
    with pytest.raises(TypeError, match="LeanCheck or a str"):
        pool.check_many([OK, 3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="non-empty"):
        pool.check("  ")
    with pytest.raises(ValueError, match="timeout_s"):
        pool.check(LeanCheck(OK, timeout_s=0))
    with pytest.raises(ValueError, match="no a theorem"):
        pool.check(LeanCheck(OK, target="def x := 1"))
    assert pool.stats()["checks_total"] == 0 and pool.stats()["backlog"] == 0
    with pytest.raises(ValueError, match="processes"):
        LeanPool(FAKE, processes=0)
    with pytest.raises(LeanUnavailableError, match="cannot start"):
        LeanPool(["/nonexistent/lake", "env", "repl"]).start()
    with pytest.raises(RuntimeError, match="not started"):
        LeanPool(FAKE).check(OK)


def test_from_config() -> None:
    cfg = load_config(None, [f"verifiers.lean.command={FAKE}", "verifiers.lean.processes=1"])
    with LeanPool.from_config(cfg.verifiers.lean) as p:
        assert p.processes == 1 and p.max_uses == 500 and p.check(OK).accepted
