"""LeanVerifier actors on a real local Ray cluster: they run checks, and the fleet adds actors
under load and removes them when idle (the actor counts over time are printed)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

FAKE = [sys.executable, str(Path(__file__).parents[1] / "verifiers" / "fake_lean_repl.py")]
OK = "theorem t : 1 + 1 = 2 := by decide"


@pytest.fixture(scope="module")
def ray_lean(tmp_path_factory: pytest.TempPathFactory):
    ray = pytest.importorskip("ray")
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, resources={"lean_repl": 4}, include_dashboard=False,
             log_to_driver=False)
    yield ray
    ray.shutdown()
    mp.undo()


@pytest.mark.ray
@pytest.mark.slow
def test_lean_verifier_actor_checks_and_reports(ray_lean) -> None:
    from compassplay.actors.lean.verifier import LeanVerifier, lean_actor_options
    from compassplay.verifiers.lean.repl_pool import LeanCheck

    opts = lean_actor_options(0, {"lean_repl": 1}, processes=2)
    actor = LeanVerifier.options(**opts).remote(command=FAKE, processes=2, timeout_s=1.0)
    reqs = [OK, LeanCheck("theorem z : 2 = 2 := by sorry"), "FAKE_HANG", "FAKE_CRASH", OK]
    verdicts = ray_lean.get(actor.check_many.remote(reqs))
    assert [v.status for v in verdicts] == ["accepted", "sorry", "timeout", "crash", "accepted"]
    stats = ray_lean.get(actor.stats.remote())
    assert stats["checks_total"] == 5 and stats["backlog"] == 0 and stats["restarts"] >= 1
    ray_lean.get(actor.close.remote())
    ray_lean.kill(actor)


@pytest.mark.ray
@pytest.mark.slow
def test_fleet_adds_actors_under_load_and_removes_them_when_idle(ray_lean) -> None:
    from compassplay.actors.lean.fleet import LeanFleet
    from compassplay.verifiers.lean.scaling import LeanScaler

    scaler = LeanScaler(min_actors=0, max_actors=4, checks_per_actor=2, idle_grace_s=1.0)
    fleet = LeanFleet({"command": FAKE, "processes": 2, "timeout_s": 10.0}, scaler,
                              num_cpus=0, resources={"lean_repl": 1})
    try:
        assert fleet.poll() == 0
        refs = [fleet.submit([f"FAKE_SLOW:1.0 {OK}"]) for _ in range(8)]
        assert fleet.size() == 4 and fleet.backlog() == 8
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (fleet.backlog() or fleet.size()):
            fleet.poll()
            time.sleep(0.2)
        verdicts = [v for batch in ray_lean.get(refs) for v in batch]
        print("\n(t s, backlog, actors):", fleet.history)
        counts = [n for _, _, n in fleet.history]
        assert all(v.accepted for v in verdicts) and len(verdicts) == 8
        assert max(counts) == 4 and counts[-1] == 0
        peak = counts.index(4)
        assert counts[:peak] == sorted(counts[:peak])
        assert counts[peak:] == sorted(counts[peak:], reverse=True)
        # Idle actors went only after the grace: the last busy poll and the drop to 0 are
        # at least idle_grace_s apart. The history holds times rounded to 10 ms, so two
        # rounded times may sit up to 10 ms closer than the clock readings they come from
        # (CI once read 2.82 - 1.82 = 0.99999...).
        last_busy = max(t for t, b, _ in fleet.history if b)
        first_zero = min(t for t, _, n in fleet.history if n == 0 and t > last_busy)
        assert first_zero - last_busy >= 1.0 - 0.01
        # Their lean_repl resources are free again (what lets the autoscaler drop Lean nodes):
        # the polls kill each removed actor once it has closed its REPLs, without waiting.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (
                fleet.retiring() or ray_lean.available_resources().get("lean_repl") != 4):
            fleet.poll()
            time.sleep(0.2)
        assert fleet.retiring() == 0
        assert ray_lean.available_resources().get("lean_repl") == 4
    finally:
        fleet.close()


def _lean_section(**over):
    from compassplay.config import LeanSection

    base = {"command": FAKE, "processes": 2, "timeout_s": 10.0,
            "actor": {"num_cpus": 0, "resources": {"lean_repl": 1}},
            "scaling": {"min_actors": 0, "max_actors": 2, "checks_per_actor": 1,
                        "idle_grace_s": 0.3, "poll_s": 0.1}}
    return LeanSection.model_validate({**base, **over})


@pytest.mark.ray
@pytest.mark.slow
def test_fleet_actor_spreads_batches_and_shrinks_when_idle(ray_lean) -> None:
    from compassplay.actors.lean.fleet_actor import FleetLeanPool, LeanFleetActor

    fleet = LeanFleetActor.remote(_lean_section())
    pool = FleetLeanPool(fleet, _lean_section())
    try:
        reqs = [OK, "theorem z : 2 = 2 := by sorry", "theorem w : 1 = 2 := by exact foo", OK]
        for _ in range(2):  # the 2nd batch is split over the 2 placed actors
            verdicts = pool.check_many(reqs)
            assert [v.status for v in verdicts] == ["accepted", "sorry", "error", "accepted"]
        assert ray_lean.get(fleet.state.remote())["peak"] == 2
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and ray_lean.get(fleet.state.remote())["actors"]:
            time.sleep(0.2)
        history = ray_lean.get(fleet.history.remote())
        print("\n(t s, backlog, actors):", history)
        counts = [n for _, _, n in history]
        assert counts[0] == 0 and max(counts) == 2 and counts[-1] == 0
        assert pool.stats()["counts"]["accepted"] == 4 and pool.stats()["checks_total"] == 8
    finally:
        ray_lean.get(fleet.close.remote())
    time.sleep(0.5)
    assert ray_lean.available_resources().get("lean_repl") == 4


@pytest.mark.ray
@pytest.mark.slow
def test_fleet_without_the_resource_fails_or_falls_back(ray_lean) -> None:
    from compassplay.actors.lean.fleet_actor import FleetLeanPool, LeanFleetActor
    from compassplay.errors import ResourceWaitError

    missing = {"actor": {"num_cpus": 0, "resources": {"lean_nowhere": 1}}, "resource_wait_s": 1}
    fleet = LeanFleetActor.remote(_lean_section(**missing))
    start = time.monotonic()
    with pytest.raises(ResourceWaitError, match=r"not placed after 1 s.*lean_nowhere"):
        FleetLeanPool(fleet, _lean_section(**missing)).check_many([OK])
    assert time.monotonic() - start < 20
    ray_lean.get(fleet.close.remote())

    fallback = {**missing, "on_no_resource": "local"}
    fleet = LeanFleetActor.remote(_lean_section(**fallback))
    pool = FleetLeanPool(fleet, _lean_section(**fallback))
    try:
        assert [v.status for v in pool.check_many([OK, OK])] == ["accepted", "accepted"]
        assert pool.stats()["fallback_local"] and pool.local is not None
    finally:
        pool.close()
        ray_lean.get(fleet.close.remote())


@pytest.mark.ray
@pytest.mark.slow
def test_fleet_stops_when_a_lean_verifier_cannot_start(ray_lean) -> None:
    from compassplay.actors.lean.fleet_actor import FleetLeanPool, LeanFleetActor
    from compassplay.errors import FatalStageError

    bad = {"command": ["/nonexistent/lake", "env", "repl"]}
    fleet = LeanFleetActor.remote(_lean_section(**bad))
    with pytest.raises(FatalStageError, match="LeanVerifier actor failed to start"):
        FleetLeanPool(fleet, _lean_section(**bad)).check_many([OK])
    ray_lean.get(fleet.close.remote())
