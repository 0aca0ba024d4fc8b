"""NodeWatch: the nodes that leave and join between two polls, named with the roles placed on
them (ray.nodes() replaced by a list the test changes; the real cluster: tests/cluster/)."""

import json

from compassplay.actors.whereabouts import node_kind
from compassplay.executors.metrics import RunMetrics
from compassplay.executors.ray import monitors as ray_monitors
from compassplay.executors.ray.monitors import NodeWatch


def _sample(metrics: RunMetrics, name: str, node_type: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"node_type": node_type})


def _node(node_id: str, alive: bool = True, **resources: float) -> dict:
    return {"NodeID": node_id, "Alive": alive, "Labels": {},
            "Resources": {"CPU": 2.0, f"node:{node_id}": 1.0, **resources}}


def test_a_node_that_leaves_is_named_with_its_roles_and_one_that_joins_is_recorded(
        tmp_path, monkeypatch):
    nodes = [_node("head", CPU=0.0), _node("aaa", python_verifier=4.0), _node("bbb", GPU=8.0)]
    monkeypatch.setattr(ray_monitors.ray, "nodes", lambda: list(nodes))
    (tmp_path / "placement.json").write_text(json.dumps({
        "verifier-0": {"node_id": "aaa", "node_type": "python_verifier"},
        "verifier-1": {"node_id": "aaa", "node_type": "python_verifier"},
        "learner": {"node_id": "bbb", "node_type": "gpu_worker"}}))
    metrics = RunMetrics("r", "cosine")
    watch = NodeWatch(tmp_path, metrics)
    assert watch.poll() == [] and watch.lost() == ""
    assert _sample(metrics, "compassplay_nodes", "python_verifier") == 1.0
    nodes[1] = _node("aaa", alive=False, python_verifier=4.0)
    nodes.append(_node("ccc", python_verifier=4.0))
    events = watch.poll()
    assert [(e["event"], e["node_id"], e["node_type"], e["roles"]) for e in events] == [
        ("left", "aaa", "python_verifier", ["verifier-0", "verifier-1"]),
        ("joined", "ccc", "python_verifier", [])]
    written = [json.loads(line) for line in (tmp_path / "nodes.jsonl").read_text().splitlines()]
    assert [e["node_id"] for e in written] == ["aaa", "ccc"] and all(e["t"] > 0 for e in written)
    assert watch.poll() == []
    # Prometheus: alive per type now, and one python_verifier lost (the head's type stays)
    assert _sample(metrics, "compassplay_nodes", "python_verifier") == 1.0
    assert _sample(metrics, "compassplay_nodes", "head") == 1.0
    assert _sample(metrics, "compassplay_nodes_lost_total", "python_verifier") == 1.0
    nodes[:] = [_node("head", CPU=0.0)]
    watch.poll()
    assert _sample(metrics, "compassplay_nodes", "python_verifier") == 0.0
    assert _sample(metrics, "compassplay_nodes_lost_total", "python_verifier") == 2.0
    assert _sample(metrics, "compassplay_nodes_lost_total", "gpu_worker") == 1.0
    # what an error after the loss says (the driver's RunError)
    assert watch.lost() == (
        "node aaa (python_verifier) left the cluster holding verifier-0, verifier-1; "
        "node bbb (gpu_worker) left the cluster holding learner; "
        "node ccc (python_verifier) left the cluster holding no actor of this run")


def test_node_kind_prefers_the_label_then_custom_resources():
    assert node_kind({"Labels": {"ray.io/node-type": "gpu_worker"}, "Resources": {}}) == \
        "gpu_worker"
    assert node_kind(_node("x", GPU=8.0, trainer_node=1.0)) == "trainer_node"
    assert node_kind(_node("y", CPU=0.0)) == "head"
    assert node_kind(_node("z")) == "cpu"
