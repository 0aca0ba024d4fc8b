"""Lean runs on the Ray executor (task.domain=lean) with the stand-in REPL on a 2-CPU local Ray
that advertises `lean_repl: 2`: the verifier actors' checks go to the Lean fleet, which grows
under load and shrinks when idle; the metrics equal the local executor's; a cluster without
the resource fails with a clear message (or falls back to local pools when configured)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import ray

from compassplay.config import load_config
from compassplay.errors import RunError
from compassplay.executors.local import LocalExecutor
from compassplay.executors.ray.pipeline_runner import run_pipeline
from tests.executors import lean_script
from tests.executors.ray.test_pipeline import metric_rows

pytestmark = [pytest.mark.slow, pytest.mark.ray]

ROOT = Path(__file__).resolve().parents[3]
FAKE = ROOT / "tests" / "verifiers" / "fake_lean_repl.py"
TARGETS = ROOT / "tests" / "envs" / "lean" / "targets.jsonl"
LEAN_REPL = 2  # what the test cluster advertises


@pytest.fixture(scope="module")
def ray_lean():
    """2 CPUs and lean_repl: 2; every worker (and this process) gets the scripted replies."""
    lean_script.install()
    # The hook is imported by name in every worker before anything else: the workers need the
    # repository on their path (pytest's rootdir is not on it when run as `python -m pytest`).
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(num_cpus=2, resources={"lean_repl": LEAN_REPL}, include_dashboard=False,
             log_to_driver=False, runtime_env={"worker_process_setup_hook": lean_script.HOOK,
                                               "env_vars": {"PYTHONPATH": path}})
    yield
    ray.shutdown()
    lean_script.uninstall()


def lean_cfg(name: str, steps: int, *extra: str):
    """micro + task.domain=lean: 1.5 CPUs of roles (1.75 with 2 verifiers) + at most 2
    LeanVerifiers x 0.125 CPU: a 2-CPU cluster."""
    return load_config(ROOT / "compassplay" / "configs" / "micro.yaml", [
        f"run.name={name}", "task.domain=lean", "task.types=[lean_prove]",
        f"task.lean.target_file={TARGETS}",
        f"verifiers.lean.command=[{sys.executable}, {FAKE}]", "verifiers.lean.processes=2",
        "reward.kind=cos_novelty", "reward.reference=local", f"pipeline.steps={steps}",
        "proposer.batch_size=2", "solver.n_samples=2", "solver.prefill=true",
        "proposer.prefill=true", "logging.progress=false", "learner.checkpoint_every=2",
        "verifiers.lean.actor.num_cpus=0.125", "verifiers.lean.scaling.min_actors=0",
        "verifiers.lean.scaling.max_actors=2", "verifiers.lean.scaling.checks_per_actor=1",
        "verifiers.lean.scaling.idle_grace_s=0.2", "verifiers.lean.scaling.poll_s=0.1", *extra])


@pytest.mark.parametrize("staleness,verifiers", [(0, 1), (1, 2)])
def test_lean_ray_run_equals_local_and_scales_the_fleet(tmp_path, ray_lean, staleness,
                                                        verifiers):
    cfg = lean_cfg(f"lean-eq{staleness}", 3, f"pipeline.staleness={staleness}",
                   f"cluster.num_verifiers={verifiers}")
    LocalExecutor(cfg, tmp_path / "local").run()
    pipe = run_pipeline(cfg, tmp_path / "ray")
    local, distributed = metric_rows(tmp_path / "local/metrics.jsonl"), \
        metric_rows(tmp_path / "ray/metrics.jsonl")
    assert [r["step"] for r in distributed] == [0, 1, 2]
    assert local == distributed  # lean_actors* are among TIMING_FIELDS (local: None)
    # not vacuous: conjectures validated, targets proved, candidates scored and rewarded;
    # iteration 0 attempts every target and, with no proved seed yet, proposes nothing
    assert distributed[0]["proposals"] == 0 and distributed[0]["targets_attempted"] == 3
    assert all(r["valid"] == 2 for r in distributed[1:])
    assert distributed[0]["coverage"] == pytest.approx(1.0)
    assert distributed[-1]["targets_proved"] == 3
    assert sum(r["eligible"] for r in distributed) == 4
    assert all(r["copy_rate"] == 0.5 for r in distributed[1:])
    assert any(r["reward_mean"] != 0.0 for r in distributed[1:])
    samples = [json.loads(x) for x in (tmp_path / "ray/samples.jsonl").read_text().splitlines()]
    assert all(s["cosine"] is not None for s in samples if s["step"] > 0)
    # Lean verdicts came back through the fleet, to every verifier actor
    counts: dict[str, int] = {}
    for snap in pipe.verifier_stats.values():
        assert snap["backend"] == "fleet" and not snap["fallback_local"]
        for k, n in snap["counts"].items():
            counts[k] = counts.get(k, 0) + n
    assert counts["accepted"] > 0 and counts["sorry"] > 0 and counts["error"] > 0
    # the fleet: 0 actors at the start, 2 under load, per-step counts in metrics.jsonl
    raw = [json.loads(x) for x in (tmp_path / "ray/metrics.jsonl").read_text().splitlines()]
    assert all(0 <= r["lean_actors"] <= r["lean_actors_peak"] <= 2 for r in raw)
    peaks = [r["lean_actors_peak"] for r in raw]
    # one verifier sends each step's checks as one batch of >= 2: 2 actors every step; two
    # verifiers send halves whose overlap in time depends on the machine's load
    assert peaks == [2, 2, 2] if verifiers == 1 else max(peaks) == 2, peaks
    history = [json.loads(x) for x in
               (tmp_path / "ray/lean_fleet.jsonl").read_text().splitlines()]
    actors = [h["actors"] for h in history]
    print(f"\nstaleness {staleness}: (t s, backlog, actors):", pipe.lean_history)
    assert actors[0] == 0 and max(actors) == 2
    assert all(h["actors"] > 0 for h in history if h["backlog"] > 0)
    if staleness == 0:  # idle between a step's grading and the next validation: back to 0
        assert 0 in actors[actors.index(2):]
    time.sleep(0.5)  # the fleet is closed: its lean_repl is free again
    assert ray.available_resources().get("lean_repl") == LEAN_REPL


def test_lean_run_without_a_node_offering_the_resource_fails_clearly(tmp_path, ray_lean,
                                                                     caplog):
    cfg = lean_cfg("lean-missing", 1, "verifiers.lean.actor.resources={lean_big_node: 1}",
                   "verifiers.lean.resource_wait_s=3")
    with pytest.raises(RunError, match=r"not placed after 3 s.*lean_big_node") as err:
        run_pipeline(cfg, tmp_path / "missing")
    assert "step 0 failed in VerifierActor.run_stage" in str(err.value)
    assert "verifiers.lean.on_no_resource=local" in str(err.value)
    assert not any("recovering" in r.message for r in caplog.records)  # no retry
    assert any("no node advertises ['lean_big_node']" in r.message for r in caplog.records)
    assert not (tmp_path / "missing" / "metrics.jsonl").read_text().strip()


def test_lean_run_falls_back_to_local_pools_when_configured(tmp_path, ray_lean):
    cfg = lean_cfg("lean-fallback", 2, "verifiers.lean.actor.resources={lean_big_node: 1}",
                   "verifiers.lean.resource_wait_s=2", "verifiers.lean.on_no_resource=local")
    pipe = run_pipeline(cfg, tmp_path / "fallback")
    rows = metric_rows(tmp_path / "fallback/metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1] and rows[-1]["coverage"] == pytest.approx(1.0)
    # (verifier stats arrive one step late: 2 steps)
    snap = pipe.verifier_stats["verifier-0"]
    assert snap["fallback_local"] and snap["local"]["checks_total"] > 0
    assert snap["counts"]["accepted"] > 0
    assert all(s.lean_actors == 0 for s in pipe.recorded)
