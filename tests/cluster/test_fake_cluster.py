"""Multi-node Ray on one machine: Ray's autoscaler launches the node types of ray_cluster.yaml
for pending actors and removes them when idle; a run places each role on its node type."""

import json
from pathlib import Path

import pytest
import ray

from compassplay.bench.fake_cluster import FakeCluster, wait_for
from compassplay.bench.fake_node_types import (
    HEAD_TYPE,
    alive_nodes_by_type,
    autoscaling_config,
    node_types_from_cluster_yaml,
)
from compassplay.config import load_config
from compassplay.executors.local import LocalExecutor
from compassplay.executors.ray.pipeline_runner import run_pipeline
from tests.executors.ray.test_pipeline import metric_rows

ROOT = Path(__file__).resolve().parents[2]
# every process of the cluster returns objects above 1 KiB through the object store (Ray's
# default inlines up to 100 KiB into the driver, the owner): a micro run's payloads then take
# the path a 7B run's take (read by conftest's fake_cluster)
CLUSTER_ENV = {"RAY_max_direct_call_object_size": "1024"}


def test_node_types_are_ray_cluster_yamls_with_laptop_cpus(tmp_path):
    types = node_types_from_cluster_yaml(ROOT / "ray_cluster.yaml", cpus=2)
    assert set(types) == {"gpu_worker", "python_verifier", "lean_verifier"}  # not the head
    assert types["gpu_worker"].resources == {"CPU": 2.0, "GPU": 8.0, "trainer_node": 1.0}
    assert types["python_verifier"].resources == {"CPU": 2.0, "python_verifier": 4.0}
    assert types["lean_verifier"].resources == {"CPU": 2.0, "lean_repl": 4.0}
    cfg = autoscaling_config(types, "127.0.0.1:1234", idle_timeout_s=6)
    assert cfg["provider"]["gcs_address"] == "127.0.0.1:1234"
    assert cfg["available_node_types"][HEAD_TYPE]["resources"] == {"CPU": 0}
    assert cfg["available_node_types"]["lean_verifier"]["resources"]["object_store_memory"] \
        == 100 * 2**20
    bad = tmp_path / "c.yaml"
    bad.write_text("provider: {}\n")
    with pytest.raises(ValueError, match="c.yaml: cannot read available_node_types"):
        node_types_from_cluster_yaml(bad)


def _alive(cluster) -> dict[str, int]:
    return alive_nodes_by_type(ray.nodes(), cluster.node_types)


@ray.remote
class Probe:
    def where(self):
        from compassplay.actors.whereabouts import here
        return here()


@pytest.mark.slow
@pytest.mark.ray
def test_the_autoscaler_adds_each_node_type_on_demand_and_removes_idle_ones(fake_cluster):
    wait_for("no worker node", lambda: set(_alive(fake_cluster)) == {HEAD_TYPE}, 60)
    asks = {"lean_verifier": {"resources": {"lean_repl": 1}},
            "python_verifier": {"resources": {"python_verifier": 1}},
            "gpu_worker": {"num_gpus": 1, "resources": {"trainer_node": 1}}}
    probes = {t: Probe.options(num_cpus=0.25, **a).remote() for t, a in asks.items()}
    where = {t: ray.get(p.where.remote(), timeout=120) for t, p in probes.items()}
    for kind, loc in where.items():
        assert loc["node_type"] == kind
    assert len({loc["node_id"] for loc in where.values()}) == 3
    assert where["gpu_worker"]["cuda_visible_devices"] == "0"
    assert where["gpu_worker"]["resources"]["GPU"] == 1
    assert _alive(fake_cluster) == {HEAD_TYPE: 1, "lean_verifier": 1, "python_verifier": 1,
                                    "gpu_worker": 1}
    for p in probes.values():
        ray.kill(p)
    wait_for("idle worker nodes removed", lambda: set(_alive(fake_cluster)) == {HEAD_TYPE},
             180)


@pytest.mark.slow
@pytest.mark.ray
def test_stopping_a_cluster_ends_its_processes_and_no_other(fake_cluster):
    other = FakeCluster(node_types=fake_cluster.node_types)
    other.start()
    assert other.pids() and not set(other.pids()) & set(fake_cluster.pids())
    other.stop()
    assert other.pids() == []
    assert ray.cluster_resources()  # the module's cluster still answers
    assert fake_cluster.pids()


@pytest.mark.slow
@pytest.mark.ray
def test_a_run_places_each_role_on_its_node_type(fake_cluster, tmp_path):
    """cluster_local on the autoscaling cluster: learner and scorer together on the trainer
    node, generators on GPUs of the GPU node, verifiers on python_verifier nodes; the metrics
    equal the local executor's."""
    cfg = load_config("cluster_local", ["pipeline.steps=2", "logging.progress=false"])
    LocalExecutor(cfg, tmp_path / "local").run()
    run_pipeline(cfg, tmp_path / "ray")
    placed = json.loads((tmp_path / "ray/placement.json").read_text())
    assert set(placed) == {"learner", "scorer-0", "proposer", "solver", "verifier-0",
                           "verifier-1"}
    learner = placed["learner"]
    assert learner["node_type"] == "gpu_worker"
    assert placed["scorer-0"]["node_id"] == learner["node_id"]
    assert learner["resources"]["trainer_node"] == 0.5
    for role in ("proposer", "solver"):
        assert placed[role]["node_type"] == "gpu_worker"
        assert placed[role]["resources"]["GPU"] == 1 and placed[role]["cuda_visible_devices"]
    for role in ("verifier-0", "verifier-1"):
        assert placed[role]["node_type"] == "python_verifier"
        assert placed[role]["resources"]["python_verifier"] == 1
    assert metric_rows(tmp_path / "ray/metrics.jsonl") == metric_rows(tmp_path / "local/metrics.jsonl")
    # payloads above Ray's inline limit (1 KiB on this cluster, as a 7B run's rollouts are
    # above the default 100 KiB) go actor to actor between nodes; the driver gets the result
    traffic = [json.loads(x) for x in (tmp_path / "ray/traffic.jsonl").read_text().splitlines()]
    print("\ntraffic per step:", [{k: v for k, v in t.items() if k != "stages"}
                                   for t in traffic])
    assert [t["step"] for t in traffic] == [0, 1]
    for t in traffic:
        assert t["payload_bytes"] > 50_000 and t["result_bytes"] > 0
        assert t["driver_bytes"] == t["result_bytes"] + sum(
            s["inline_bytes"] for s in t["stages"].values())
        assert t["stages"]["propose"]["inline_bytes"] == 0  # in the proposer node's store
        # proposals (gpu_worker) are validated on python_verifier nodes: copied across
        assert t["stages"]["propose"]["cross_node_bytes"] > 0 and t["cross_node_bytes"] > 0
        assert t["driver_share"] < 0.1
    wait_for("idle worker nodes removed", lambda: set(_alive(fake_cluster)) == {HEAD_TYPE},
             180)
