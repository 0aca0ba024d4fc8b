"""The Ray pipeline on a real local Ray: equality with the local executor, faults, metrics."""

import json
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import ray

from compassplay.config import load_config
from compassplay.executors.local import LocalExecutor
from compassplay.executors.ray.pipeline_runner import run_pipeline
from compassplay.rundir.runlog import comparable_steps as metric_rows  # step rows, no timing
from compassplay.step.graph import STEP

pytestmark = [pytest.mark.slow, pytest.mark.ray]

CONFIGS = Path(__file__).resolve().parents[3] / "compassplay" / "configs"
MICRO = CONFIGS / "micro.yaml"
# the warm micro model writes valid tasks and solves some: rewards, scorer and learner see signal
WARM = CONFIGS / "micro_warm.yaml"


FAST = ["proposer.batch_size=2", "solver.n_samples=2", "proposer.max_new_tokens=24",
        "solver.max_new_tokens=16", "logging.progress=false"]
WARM_FAST = ["proposer.batch_size=2", "solver.n_samples=4", "solver.seed_tasks_per_step=1",
             "logging.progress=false"]


@pytest.mark.parametrize("staleness,verifiers,scorers", [(0, 1, 1), (1, 2, 2)])
def test_ray_executor_equals_local_executor(tmp_path, ray_local, staleness, verifiers, scorers):
    """The same step graph in both executors: equal metrics, at staleness 0 and with rollout
    one step ahead, with the work of each stage spread over several verifiers and scorers."""
    cfg = load_config(WARM, WARM_FAST + ["pipeline.steps=3", f"pipeline.staleness={staleness}",
                                         "learner.checkpoint_every=2",
                                         f"cluster.num_verifiers={verifiers}",
                                         f"scorer.num_scorers={scorers}"])
    LocalExecutor(cfg, tmp_path / "local").run()
    seen: list[tuple[int, str]] = []
    run_pipeline(cfg, tmp_path / "ray",
                 on_pipeline=lambda p: setattr(p, "on_stage", lambda *a: seen.append(a)))
    local, distributed = metric_rows(tmp_path / "local/metrics.jsonl"), \
        metric_rows(tmp_path / "ray/metrics.jsonl")
    assert [r["step"] for r in distributed] == [0, 1, 2]
    assert local == distributed
    assert [r["weight_version"] for r in distributed] == [1, 2, 3]
    raw = [json.loads(x) for x in (tmp_path / "ray/metrics.jsonl").read_text().splitlines()]
    walls = [(r["wall_seconds"], r["step_seconds"]) for r in raw if "wall_seconds" in r]
    assert len(walls) == 3 and all(w > 0 for w, _ in walls)
    if staleness == 0:  # one step at a time: the wall holds the step's stages
        assert all(w >= s for w, s in walls)
    # the comparison is not vacuous: tasks were valid, scored and learned from
    assert sum(r["eligible"] for r in distributed) > 0
    assert any(r["loss"] != 0.0 for r in distributed)
    # the progress bar's stage: names from the step graph, in graph order within a step
    names = [st.name for st in STEP]
    assert seen and {s for _, s in seen} <= set(names) | {""}
    for step in {k for k, _ in seen}:
        order = [names.index(s) for k, s in seen if k == step and s]
        assert order == sorted(order)


ROLES = ["verifier", "scorer", "solver", "proposer", "learner"]


def _kill_one_role_per_step(roles: list[str]):
    """A hook that kills `roles[k]`'s actor (Ray restarts it) as step k is recorded."""
    def hook(pipeline):
        original = pipeline.progress
        killed: list[tuple[int, str]] = []

        def progress(stats):
            if len(killed) < len(roles):
                role = roles[len(killed)]
                actors = pipeline.actors
                handle = {"verifier": actors.verifiers[0], "scorer": actors.scorers[0],
                          "solver": actors.solver, "proposer": actors.proposer,
                          "learner": actors.learner.ranks[0]}[role]
                ray.kill(handle, no_restart=False)
                killed.append((stats.step, role))
            if original is not None:
                original(stats)
        pipeline.progress = progress
        pipeline.killed = killed
    return hook


def test_each_actor_killed_mid_run_completes_with_exact_step_accounting(tmp_path, ray_local):
    """One run, one role's actor killed after each of steps 0-4 (verifier, scorer, solver,
    proposer, learner): every step is recorded once, in order, with its own weight version."""
    steps = len(ROLES) + 1
    cfg = load_config(WARM, WARM_FAST + [f"pipeline.steps={steps}", "pipeline.staleness=1",
                                         "learner.checkpoint_every=1", "run.name=kill"])
    pipe = run_pipeline(cfg, tmp_path / "kill", on_pipeline=_kill_one_role_per_step(ROLES))
    assert pipe.killed == list(enumerate(ROLES))
    rows = metric_rows(tmp_path / "kill" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(steps))
    versions = [r["weight_version"] for r in rows]
    assert versions == sorted(versions) and len(set(versions)) == steps
    assert [s.step for s in pipe.recorded] == list(range(steps))


def test_prometheus_endpoint_scraped_during_run(tmp_path, ray_local):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = load_config(MICRO, FAST + ["pipeline.steps=3", f"logging.prometheus_port={port}"])
    scraped: list[str] = []

    def scrape():
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                              timeout=2).read().decode()
                if "compassplay_step " in body and "compassplay_learner_loss " in body:
                    scraped.append(body)
                    if body.count("compassplay_stage_seconds_count") >= 6:
                        return
            except OSError:
                pass
            time.sleep(0.2)

    t = threading.Thread(target=scrape, daemon=True)
    t.start()
    run_pipeline(cfg, tmp_path / "prom")
    t.join(timeout=30)
    assert scraped, "metrics endpoint never answered during the run"
    body = scraped[-1]
    for name in ["compassplay_step", "compassplay_weight_version", "compassplay_queue_depth",
                 "compassplay_stage_seconds_bucket", "compassplay_proposals_total",
                 "compassplay_valid_total", "compassplay_eligible_total",
                 "compassplay_solve_rate_bucket", "compassplay_reward_mean",
                 "compassplay_reward_distinct", "compassplay_score_advantage_share",
                 "compassplay_scorer_seconds",
                 "compassplay_verifier_runs_per_second", "compassplay_verifier_runs",
                 "compassplay_learner_loss", "compassplay_learner_grad_norm"]:
        assert name in body, name
