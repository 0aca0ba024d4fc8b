"""Nodes lost mid-run on a multi-node cluster grown by Ray's autoscaler: the raylet of the node
holding a role is SIGKILLed once step 0 is recorded; the run completes and its metrics equal
the local executor's over the same seed (no task, sample or reward lost or counted twice).
The GCS here checks each node's health every second and marks it dead after 3 missed checks
(Ray 2.60's defaults, 3 s x 5, make a lost node take about 30 s to be noticed)."""

import json
import time
from pathlib import Path

import pytest
import ray

from compassplay.bench.cluster import FAST_HEALTH_CHECKS, NodeKiller, compare_runs
from compassplay.bench.fake_cluster import FakeCluster, wait_for
from compassplay.bench.fake_node_types import HEAD_TYPE, alive_nodes_by_type
from compassplay.config import load_config
from compassplay.errors import RunError
from compassplay.executors.local import LocalExecutor
from compassplay.executors.ray.pipeline_runner import run_pipeline
from tests.executors.ray.test_pipeline import metric_rows

pytestmark = [pytest.mark.slow, pytest.mark.ray]
OVERRIDES = ["pipeline.steps=3", "logging.progress=false", "learner.checkpoint_every=1"]
CLUSTER_ENV = FAST_HEALTH_CHECKS  # read by conftest's fake_cluster


@pytest.fixture(scope="module")
def local_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("local")
    LocalExecutor(load_config("cluster_local", OVERRIDES), out).run()
    return out


@pytest.fixture(scope="module")
def local_rows(local_dir) -> list[dict]:
    return metric_rows(local_dir / "metrics.jsonl")


def _no_task_lost_or_doubled(run_dir: Path, local_dir: Path) -> None:
    """samples.jsonl holds each (step, task) of the local run once: none lost, none twice."""
    cmp = compare_runs(run_dir, local_dir)
    assert cmp["tasks"] > 0 and cmp["steps_completed"] == 3, cmp
    assert cmp["tasks_lost"] == 0 and cmp["tasks_counted_twice"] == 0, cmp


def _run_with_kill(cluster: FakeCluster, run_dir: Path, role: str) -> NodeKiller:
    killer = NodeKiller(cluster, run_dir, role)
    killer.start()
    run_pipeline(load_config("cluster_local", OVERRIDES), run_dir)
    killer.join(timeout=10)
    assert killer.error is None, killer.error
    return killer


def _unversioned(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.endswith("weight_version")}


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "nodes.jsonl").read_text().splitlines()]


def test_a_verifier_node_lost_mid_run_is_replaced_and_nothing_is_lost(fake_cluster, local_rows,
                                                                      local_dir, tmp_path):
    killer = _run_with_kill(fake_cluster, tmp_path, "verifier-0")
    assert 1 <= killer.steps_before_kill < 3  # the kill landed while the run went on
    assert metric_rows(tmp_path / "metrics.jsonl") == local_rows
    _no_task_lost_or_doubled(tmp_path, local_dir)
    events = _events(tmp_path)
    left = [e for e in events if e["event"] == "left"]
    assert [e["node_id"] for e in left] == [killer.killed]
    assert set(left[0]["roles"]) == {"verifier-0", "verifier-1"}
    assert any(e["event"] == "joined" and e["node_type"] == "python_verifier" for e in events)
    wait_for("idle worker nodes removed", lambda: set(alive_nodes_by_type(
        ray.nodes(), fake_cluster.node_types)) == {HEAD_TYPE}, 180)


def test_the_learners_node_lost_mid_run_rolls_back_and_ends_equal(fake_cluster, local_rows,
                                                                  local_dir, tmp_path):
    """The gpu_worker node holds learner, scorer, proposer and solver: all restart on a node
    the autoscaler launches, the failed step names the learner's call, the run rolls back to
    the last checkpoint and its metrics equal an uninterrupted run's."""
    start = time.monotonic()
    killer = _run_with_kill(fake_cluster, tmp_path, "learner")
    assert 1 <= killer.steps_before_kill < 3
    rows = metric_rows(tmp_path / "metrics.jsonl")
    # The restored learner publishes fresh weight versions (above any an actor may hold), so
    # the versions after the rollback skip ahead; every other figure equals the local run's.
    assert [_unversioned(r) for r in rows] == [_unversioned(r) for r in local_rows]
    _no_task_lost_or_doubled(tmp_path, local_dir)  # the steps run again wrote theirs once
    versions = [r["weight_version"] for r in rows]
    assert versions == sorted(set(versions)) and versions[-1] > local_rows[-1]["weight_version"]
    left = [e for e in _events(tmp_path) if e["event"] == "left"]
    assert [e["node_id"] for e in left] == [killer.killed]
    assert {"learner", "scorer-0", "proposer", "solver"} <= set(left[0]["roles"])
    assert time.monotonic() - start < 600



def test_the_learners_node_lost_without_retries_stops_naming_it_and_resume_continues(
        fake_cluster, local_rows, local_dir, tmp_path):
    """With `pipeline.max_step_retries=0` a lost learner node ends the run with an error that
    names the learner's call, the node and its type, within a bounded time of the kill;
    `--resume` (a new driver, a gpu_worker node the autoscaler launches in place of the lost
    one) continues from the last checkpoint and ends equal to an uninterrupted run."""
    cfg = load_config("cluster_local", [*OVERRIDES, "pipeline.max_step_retries=0"])
    killer = NodeKiller(fake_cluster, tmp_path, "learner")
    killer.start()
    with pytest.raises(RunError) as stopped:
        run_pipeline(cfg, tmp_path)
    stopped_at = time.monotonic()
    killer.join(timeout=10)
    assert killer.error is None and killer.killed, killer.error
    message = str(stopped.value)
    # the failed call is named when Ray's error names it (an in-flight LearnerActor call);
    # a call to an actor already restarting fails as ActorUnavailableError, named by the roles
    assert ("LearnerActor" in message or "ActorUnavailableError" in message) \
        and killer.killed[:12] in message, message
    assert "(gpu_worker) left the cluster holding" in message and "learner" in message, message
    assert f"--resume {tmp_path}" in message, message
    # the error came within the health checks' bound of the kill, not after a hang
    assert stopped_at - killer.killed_at < 60, stopped_at - killer.killed_at
    done_before = len(metric_rows(tmp_path / "metrics.jsonl"))
    assert 1 <= done_before < 3

    run_pipeline(cfg, tmp_path, resume=True)
    rows = metric_rows(tmp_path / "metrics.jsonl")
    assert [_unversioned(r) for r in rows] == [_unversioned(r) for r in local_rows]
    _no_task_lost_or_doubled(tmp_path, local_dir)
    placed = json.loads((tmp_path / "placement.json").read_text())
    assert placed["learner"]["node_id"] != killer.killed  # on a fresh node
    assert placed["learner"]["node_type"] == "gpu_worker"
