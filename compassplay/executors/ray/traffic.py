"""Bytes a Ray step's stage payloads moved, read from Ray's object directory once per step.

Each stage's output is an ObjectRef the driver owns (it submitted the call) and passes on to
the next stage's actor. `ray.experimental.get_object_locations` gives each object's size and
the nodes whose object stores hold a copy:

- an object in the object store (`node_ids` not empty; Ray puts returns above
  `max_direct_call_object_size`, 100 KiB, there) goes from its producer's node to each node
  that reads it, actor to actor, without the driver: every copy past the first is a transfer
  between nodes (`cross_node_bytes`, a lower bound: a secondary copy may be evicted before
  the query);
- a small object (`node_ids` empty) is returned inline to its owner, the driver process, and
  sent with each call that takes it: these bytes pass through the driver
  (`driver_bytes`, counted once per object), as does the step result the driver fetches.

One line per step goes to RUN_DIR/traffic.jsonl: {step, stages: {stage: {objects, bytes,
inline_bytes, copies, cross_node_bytes}} (the result's stage aside), payload_bytes, cross_node_bytes, result_bytes, driver_bytes,
driver_share (driver_bytes / (payload_bytes + result_bytes))}.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import ray

log = logging.getLogger(__name__)

TRAFFIC_FILE = "traffic.jsonl"


def _refs(handle: Any) -> list[Any]:
    """The ObjectRefs in one stage's handle (a ref, a list of them, or None)."""
    items = handle if isinstance(handle, list | tuple) else [handle]
    return [r for r in items if isinstance(r, ray.ObjectRef)]


def step_traffic(step: int, handles: dict[str, Any], result: Any,
                 timeout_ms: int = 5000) -> dict[str, Any]:
    """One step's traffic line from its stage handles and its result ref (see the module)."""
    by_stage = {name: _refs(h) for name, h in handles.items()}
    everything = [r for refs in by_stage.values() for r in refs] + _refs(result)
    where = ray.experimental.get_object_locations(everything, timeout_ms=timeout_ms)
    stages: dict[str, dict[str, int]] = {}
    seen: set[Any] = set()
    fetched = set(_refs(result))
    for name, refs in by_stage.items():
        row = {"objects": 0, "bytes": 0, "inline_bytes": 0, "copies": 0, "cross_node_bytes": 0}
        for ref in refs:
            if ref in seen or ref in fetched or ref not in where:
                continue
            seen.add(ref)
            size, nodes = int(where[ref].get("object_size") or 0), where[ref]["node_ids"]
            row["objects"] += 1
            row["bytes"] += size
            row["inline_bytes"] += 0 if nodes else size
            row["copies"] += max(0, len(nodes) - 1)
            row["cross_node_bytes"] += size * max(0, len(nodes) - 1)
        stages[name] = row
    result_bytes = sum(int(where[r].get("object_size") or 0) for r in _refs(result)
                       if r in where)
    payload = sum(s["bytes"] for s in stages.values())
    driver = sum(s["inline_bytes"] for s in stages.values()) + result_bytes
    return {"step": step, "stages": stages, "payload_bytes": payload,
            "cross_node_bytes": sum(s["cross_node_bytes"] for s in stages.values()),
            "result_bytes": result_bytes, "driver_bytes": driver,
            "driver_share": round(driver / max(1, payload + result_bytes), 4)}


class TrafficLog:
    """Appends each recorded step's traffic to RUN_DIR/traffic.jsonl (a lookup that fails is
    logged and skipped: the figures are for people, not for the run)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / TRAFFIC_FILE
        self.rows: list[dict[str, Any]] = []

    def record(self, step: int, handles: dict[str, Any], result: Any) -> None:
        try:
            row = step_traffic(step, handles, result)
        except Exception as exc:  # noqa: BLE001 -- see the class docstring
            log.warning("step %d: payload sizes unavailable (%s)", step, exc)
            return
        self.rows.append(row)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        log.info("step %d moved %d payload bytes (%d between nodes, %d through the driver, "
                 "share %.3f)", step, row["payload_bytes"], row["cross_node_bytes"],
                 row["driver_bytes"], row["driver_share"])
