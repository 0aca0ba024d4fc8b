"""Where each actor of a run landed: node, node type, the resources Ray assigned it.

Every actor answers `where()` with `here()`, called in its own process. After the actors are
up the driver writes the answers to `RUN_DIR/placement.json` (role -> location) and logs one
line per node, so a run spread over a cluster says which node holds which role (and the node
named in a later failure can be looked up there). `node_kind` names a node of `ray.nodes()`
the same way for the driver's view of the cluster.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

log = logging.getLogger(__name__)

NODE_TYPE_ENV = "RAY_NODE_TYPE_NAME"  # set on nodes Ray's autoscaler launched
BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def node_kind(node: dict[str, Any]) -> str:
    """A `ray.nodes()` entry's node type: its `ray.io/node-type` label, else the names of the
    custom resources it offers ('head' for a node that offers none and no CPUs)."""
    label = (node.get("Labels") or {}).get("ray.io/node-type")
    if label:
        return str(label)
    res = node.get("Resources") or {}
    custom = sorted(k for k in res if k not in BUILTIN_RESOURCES and not k.startswith("node:")
                    and not k.startswith("accelerator_type:"))
    return "+".join(custom) or ("cpu" if res.get("CPU") else "head")


def here() -> dict[str, Any]:
    """This actor's location: node id and IP, node type (the autoscaler's node-type name, or
    the node's `ray.io/node-type` label; '' on a node started by hand), the resources Ray
    assigned it (for GPUs, CUDA_VISIBLE_DEVICES as Ray set it) and its pid."""
    ctx = ray.get_runtime_context()
    labels = ctx.get_node_labels() or {}
    kind = os.environ.get(NODE_TYPE_ENV) or labels.get("ray.io/node-type", "")
    return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
            "node_type": kind if isinstance(kind, str) else ",".join(kind),
            "resources": {k: round(v, 4) for k, v in ctx.get_assigned_resources().items()},
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid()}


def record_placement(actors: dict[str, Any], run_dir: Path | None,
                     timeout_s: float = 60.0) -> dict[str, dict[str, Any]]:
    """Ask every actor (role -> handle) `where()`; write `run_dir/placement.json` and log one
    line per node. An actor that does not answer in `timeout_s` is recorded with its error."""
    refs = {role: a.where.remote() for role, a in actors.items() if hasattr(a, "where")}
    out: dict[str, dict[str, Any]] = {}
    for role, ref in refs.items():
        try:
            out[role] = ray.get(ref, timeout=timeout_s)
        except (GetTimeoutError, RayActorError) as exc:
            out[role] = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"}
    by_node: dict[str, list[str]] = {}
    for role, loc in out.items():
        key = f"{loc.get('node_id', '?')[:12]} ({loc.get('node_type') or 'untyped'})"
        by_node.setdefault(key, []).append(role)
    for node, roles in sorted(by_node.items()):
        log.info("node %s: %s", node, ", ".join(roles))
    if run_dir is not None:
        Path(run_dir, "placement.json").write_text(json.dumps(out, indent=1, sort_keys=True))
    return out
