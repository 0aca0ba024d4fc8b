"""The node types of a fake multi-node cluster (`bench.fake_cluster`) and the autoscaling config
Ray's `fake_multinode` provider reads: the worker node types of the repository's
`ray_cluster.yaml` (custom resources and GPU counts as written, CPU and object store scaled to a
laptop), and which type a `ray.nodes()` entry is."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from compassplay.actors.whereabouts import BUILTIN_RESOURCES

HEAD_TYPE = "ray.head.default"  # the fake provider's fixed name for the head's node type
REPO_CLUSTER_YAML = Path(__file__).resolve().parents[2] / "ray_cluster.yaml"


@dataclass(frozen=True)
class FakeNodeType:
    """One worker node type: `resources` as Ray sees them (CPU and GPU counts, custom
    resources), `object_store_mb` of object store per node, at most `max_workers` nodes."""

    name: str
    resources: dict[str, float]
    object_store_mb: int = 100
    max_workers: int = 2

    def provider_resources(self) -> dict[str, float]:
        """The node type's `resources` in the autoscaling config (the fake provider pops
        `object_store_memory`, in bytes, into the node's object store size)."""
        return {**self.resources, "object_store_memory": self.object_store_mb * 2**20}


def node_types_from_cluster_yaml(path: Path = REPO_CLUSTER_YAML, cpus: float = 2,
                                 object_store_mb: int = 100, max_workers: int = 2,
                                 ) -> dict[str, FakeNodeType]:
    """The worker node types of a cluster-launcher YAML (`available_node_types` but the head),
    with each type's GPU count and custom resources as written and `cpus` CPUs (a 96-CPU node
    would make Ray start a worker process per CPU)."""
    try:
        spec = yaml.safe_load(Path(path).read_text())
        types = spec["available_node_types"]
        head = spec.get("head_node_type")
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: cannot read available_node_types ({exc})") from None
    out = {}
    for name, body in types.items():
        res = dict((body or {}).get("resources") or {})
        if name == head or name == "head" or res.get("CPU", 1) == 0:
            continue  # the head runs no actors
        resources = {k: float(v) for k, v in res.items() if k not in BUILTIN_RESOURCES}
        resources["CPU"] = float(cpus)
        if res.get("GPU"):
            resources["GPU"] = float(res["GPU"])
        out[name] = FakeNodeType(name, resources, object_store_mb,
                                 min(max_workers, int(body.get("max_workers", max_workers))))
    if not out:
        raise ValueError(f"{path}: no worker node type in available_node_types")
    return out


def autoscaling_config(node_types: Mapping[str, FakeNodeType], gcs_address: str,
                       idle_timeout_s: float) -> dict[str, Any]:
    """The autoscaling config for `ray start --head --autoscaling-config` (fake_multinode)."""
    types: dict[str, Any] = {HEAD_TYPE: {"resources": {"CPU": 0}, "node_config": {},
                                         "max_workers": 0}}
    for t in node_types.values():
        types[t.name] = {"resources": t.provider_resources(), "node_config": {},
                         "min_workers": 0, "max_workers": t.max_workers}
    return {
        "cluster_name": "compassplay-fake",
        "max_workers": sum(t.max_workers for t in node_types.values()),
        "upscaling_speed": 2.0,
        "idle_timeout_minutes": idle_timeout_s / 60.0,
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True,
                     "disable_node_updaters": True, "disable_launch_config_check": True,
                     "gcs_address": gcs_address},
        "auth": {"ssh_user": "ubuntu"},
        "head_node_type": HEAD_TYPE,
        "available_node_types": types,
        "docker": {},
        "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "rsync_exclude": [], "rsync_filter": [],
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


def node_type_of(node: Mapping[str, Any], node_types: Mapping[str, FakeNodeType]) -> str:
    """The node type of one `ray.nodes()` entry: the type whose custom resources it offers
    (the head when none); '?' when none matches."""
    have = node.get("Resources", {})
    for t in node_types.values():
        custom = [k for k in t.resources if k not in BUILTIN_RESOURCES]
        if custom and all(k in have for k in custom):
            return t.name
    return HEAD_TYPE if not have.get("CPU") else "?"


def alive_nodes_by_type(nodes: list[Mapping[str, Any]],
                        node_types: Mapping[str, FakeNodeType]) -> dict[str, int]:
    """How many alive nodes of each type `ray.nodes()` lists."""
    counts: dict[str, int] = {}
    for n in nodes:
        if n.get("Alive"):
            t = node_type_of(n, node_types)
            counts[t] = counts.get(t, 0) + 1
    return counts
