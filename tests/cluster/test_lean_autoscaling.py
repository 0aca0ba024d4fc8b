"""The Lean fleet grown through Ray's autoscaler: a Lean run (the stand-in REPL, scripted
replies) on a cluster that starts with no worker node. The fleet's backlog asks for more
LeanVerifier actors than one `lean_verifier` node holds (lean_repl: 4), the autoscaler launches
a second one, the actors go when the backlog drains and the autoscaler removes the idle Lean
nodes while the run goes on; lean_fleet.jsonl records it and lean_fleet.png shows it. Then a
Lean node is lost with checks in flight, and no check, task or reward is lost or doubled."""

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest
import ray
from ray.exceptions import GetTimeoutError

from compassplay.bench.cluster import FAST_HEALTH_CHECKS, compare_runs
from compassplay.bench.fake_cluster import FakeCluster, wait_for
from compassplay.bench.fake_node_types import HEAD_TYPE, alive_nodes_by_type
from compassplay.commands.plot import plot_lean_fleet, read_lean_timeline
from compassplay.config import load_config
from compassplay.executors.local import LocalExecutor
from compassplay.executors.ray.pipeline_runner import run_pipeline
from tests.executors import lean_script
from tests.executors.ray.test_pipeline import metric_rows

pytestmark = [pytest.mark.slow, pytest.mark.ray]

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "verifiers" / "fake_lean_repl.py"
TARGETS = ROOT / "tests" / "envs" / "lean" / "targets.jsonl"
CLUSTER_IDLE_TIMEOUT_S = 2.0  # read by conftest's fake_cluster: idle Lean nodes go soon
CLUSTER_RUNTIME_ENV = {  # every worker of the run gets the scripted replies; its stand-in
    "worker_process_setup_hook": lean_script.HOOK,  # REPLs take 1 s per check (the local
    "env_vars": {"PYTHONPATH": os.pathsep.join(     # executor's, in this process, do not)
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "FAKE_LEAN_CHECK_DELAY_S": "1.0"}}
CLUSTER_ENV = FAST_HEALTH_CHECKS  # a lost node is marked dead in about 3 s
LEAN_NODE = "lean_repl"  # how whereabouts.node_kind names a lean_verifier node (its resource)


def lean_cluster_cfg(steps: int, name: str = "lean-autoscale"):
    """micro + task.domain=lean with cluster_local's roles: learner and scorer on the trainer
    node, generators on its GPUs, verifiers on python_verifier nodes; LeanVerifiers ask
    lean_repl: 1 (4 per lean_verifier node), one per check in flight, at most 6."""
    return load_config(ROOT / "compassplay" / "configs" / "micro.yaml", [
        f"run.name={name}", "task.domain=lean", "task.types=[lean_prove]",
        f"task.lean.target_file={TARGETS}",
        f"verifiers.lean.command=[{sys.executable}, {FAKE}]", "verifiers.lean.processes=1",
        "reward.kind=cos_novelty", "reward.reference=local", f"pipeline.steps={steps}",
        "proposer.batch_size=2", "solver.n_samples=4", "solver.prefill=true",
        "proposer.prefill=true", "logging.progress=false",
        "cluster.proposer={num_cpus: 0.25, num_gpus: 1}",
        "cluster.solver={num_cpus: 0.25, num_gpus: 1}",
        "cluster.learner={num_cpus: 0.5, num_gpus: 1, resources: {trainer_node: 0.5}}",
        "cluster.scorer={num_cpus: 0.25, num_gpus: 1, resources: {trainer_node: 0.5}}",
        "cluster.verifier={num_cpus: 0.25, resources: {python_verifier: 1}}",
        "cluster.num_verifiers=2", "cluster.startup_timeout_s=300",
        "verifiers.lean.actor.num_cpus=0.25", "verifiers.lean.scaling.min_actors=0",
        "verifiers.lean.scaling.max_actors=6", "verifiers.lean.scaling.checks_per_actor=1",
        "verifiers.lean.scaling.idle_grace_s=0.5", "verifiers.lean.scaling.poll_s=0.2",
        "verifiers.lean.resource_wait_s=300"])


def _lean_nodes(cluster) -> int:
    return alive_nodes_by_type(ray.nodes(), cluster.node_types).get("lean_verifier", 0)


def _hold_after_step_0(cluster):
    """The driver, once step 0 is recorded, waits (at most 90 s) until the autoscaler has
    removed an idle Lean node before it submits step 1: a stand-in for a 7B run's learn and
    propose stages, minutes without a Lean check in flight, where this micro run's take 2 s."""
    def hook(pipe):
        record = pipe._record

        def record_then_hold(result):
            record(result)
            if result.stats.step == 0:
                wait_for("an idle Lean node removed", lambda: _lean_nodes(cluster) < 2, 90)
        pipe._record = record_then_hold
    return hook


def test_the_lean_fleet_grows_onto_nodes_the_autoscaler_adds_and_shrinks_with_them(
        fake_cluster, tmp_path):
    wait_for("no worker node", lambda: set(alive_nodes_by_type(
        ray.nodes(), fake_cluster.node_types)) == {HEAD_TYPE}, 60)
    cfg = lean_cluster_cfg(steps=3)
    lean_script.install()
    try:
        LocalExecutor(cfg, tmp_path / "local").run()
    finally:
        lean_script.uninstall()
    run_pipeline(cfg, tmp_path / "ray", on_pipeline=_hold_after_step_0(fake_cluster))
    assert metric_rows(tmp_path / "ray/metrics.jsonl") == \
        metric_rows(tmp_path / "local/metrics.jsonl")

    rows = read_lean_timeline(tmp_path / "ray/lean_fleet.jsonl")
    lean_nodes = [r["nodes"].get(LEAN_NODE, 0) for r in rows]
    print("\n(t, backlog, actors, placed, lean nodes, start waits):",
          [(r["t"], r["backlog"], r["actors"], r["placed"], n, r["start_waits"])
           for r, n in zip(rows, lean_nodes, strict=True)])
    assert rows[0]["actors"] == 0 and lean_nodes[0] == 0  # from zero Lean nodes
    # the backlog asked for 6 actors, more than one node's 4 lean_repl: two Lean nodes came
    assert max(r["actors"] for r in rows) == 6
    assert max(r["placed"] for r in rows) > 4 and max(lean_nodes) == 2
    peak = lean_nodes.index(2)
    # ... every actor came up, after a wait that includes the node's launch
    waits = [w for r in rows for w in r["start_waits"]]
    assert len(waits) >= 6 and all(0 < w < 300 for w in waits)
    assert max(waits) > 1.0  # at least one actor waited for a node to be launched
    # the backlog drained, the actors went, the autoscaler removed the idle Lean nodes, and
    # the next step's backlog made it launch them again: all within the run
    low = next(i for i in range(peak, len(rows)) if lean_nodes[i] < 2)
    # (node counts are sampled once a second: the drop may show after step 1 asked again)
    assert any(r["actors"] == 0 and r["backlog"] == 0 for r in rows[peak:low])
    assert any(r["placed"] > 0 and r["start_waits"] for r in rows[low:])  # started again
    left = [json.loads(x) for x in (tmp_path / "ray/nodes.jsonl").read_text().splitlines()]
    assert any(e["event"] == "left" and e["node_type"] == LEAN_NODE for e in left)
    assert all(r["actors"] > 0 for r in rows if r["backlog"] > 0)
    png = plot_lean_fleet(tmp_path / "ray")
    assert png is not None and png.stat().st_size > 10_000
    # (the removal of the idle Lean nodes within the run is asserted above; the full drain
    # after the run took over 180 s twice on 2026-12-06 and is left to the module's teardown)


class LeanNodeKiller(threading.Thread):
    """Kills the busiest Lean node (most `lean_repl` in use) once the run's fleet has checks
    in flight on a placed LeanVerifier; `backlog` is the fleet's backlog at the kill."""

    def __init__(self, cluster: FakeCluster, fleet_name: str, timeout_s: float = 240) -> None:
        super().__init__(daemon=True)
        self.cluster, self.fleet_name, self.timeout_s = cluster, fleet_name, timeout_s
        self.killed, self.backlog, self.error = "", 0, None

    def run(self) -> None:
        from ray._private.state import available_resources_per_node

        try:
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline:
                try:
                    state = ray.get(ray.get_actor(self.fleet_name).state.remote(), timeout=10)
                except ValueError:  # the fleet actor is not up yet
                    state = {"backlog": 0}
                except GetTimeoutError:  # its lock is held by a poll (ray.nodes(), an idle
                    continue             # actor's close): ask again, the deadline still holds
                if state["backlog"] > 0 and state["actors"] > state["unplaced"]:
                    lean = {n["NodeID"]: n["Resources"]["lean_repl"] for n in ray.nodes()
                            if n.get("Alive") and "lean_repl" in n.get("Resources", {})}
                    free = available_resources_per_node()
                    busy = {nid: total - free.get(nid, {}).get("lean_repl", 0.0)
                            for nid, total in lean.items()}
                    if busy and max(busy.values()) > 0:
                        self.backlog = state["backlog"]
                        self.killed = max(busy, key=busy.get)
                        self.cluster.kill_node(self.killed)
                        return
                time.sleep(0.1)
            raise TimeoutError("no Lean check in flight on a placed LeanVerifier")
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_a_lean_node_lost_with_checks_in_flight_loses_no_check(fake_cluster, tmp_path):
    """The node under the busiest LeanVerifiers is SIGKILLed while they check (1 s per check):
    Ray restarts the actors on a node the autoscaler launches and retries their calls, the
    run completes, and its metrics and tasks equal the local executor's."""
    cfg = lean_cluster_cfg(steps=2, name="lean-kill")
    lean_script.install()
    try:
        LocalExecutor(cfg, tmp_path / "local").run()
    finally:
        lean_script.uninstall()
    killer = LeanNodeKiller(fake_cluster, "lean-kill:lean-fleet")
    killer.start()
    run_pipeline(cfg, tmp_path / "ray")
    killer.join(timeout=10)
    assert killer.error is None, killer.error
    assert killer.killed and killer.backlog > 0
    assert metric_rows(tmp_path / "ray/metrics.jsonl") == \
        metric_rows(tmp_path / "local/metrics.jsonl")
    cmp = compare_runs(tmp_path / "ray", tmp_path / "local")
    assert cmp["tasks_lost"] == 0 and cmp["tasks_counted_twice"] == 0 and cmp["tasks"] > 0, cmp
    assert not any(n["Alive"] for n in ray.nodes() if n["NodeID"] == killer.killed)
    events = [json.loads(x) for x in (tmp_path / "ray/nodes.jsonl").read_text().splitlines()]
    assert killer.killed in [e["node_id"] for e in events if e["event"] == "left"]
    # the fleet saw its Lean nodes drop while checks were still in flight
    rows = read_lean_timeline(tmp_path / "ray/lean_fleet.jsonl")
    counts = [(r["nodes"].get(LEAN_NODE, 0), r["backlog"]) for r in rows]
    assert any(n < prev and backlog > 0
               for (prev, _), (n, backlog) in zip(counts, counts[1:], strict=False)), counts
