"""What the Ray driver watches beside the steps, none of it blocking a step: evaluations on the
eval actor, the Lean fleet's actor count, the sandbox stats of the verifiers, and the nodes
that join and leave the cluster."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayError

from compassplay.actors.whereabouts import node_kind
from compassplay.config import RunConfig
from compassplay.executors.metrics import RunMetrics
from compassplay.rundir.runlog import LEAN_FLEET_FILE, RunLog
from compassplay.workers.eval_worker import EvalReport

log = logging.getLogger(__name__)


@dataclass
class PendingEval:
    """An evaluation submitted to the eval actor: the weights after `step`."""

    step: int
    ref: Any


class EvalQueue:
    """Evaluations during training (`eval.every_steps`): submitted without waiting, written as
    "eval" lines once their step is recorded, at most `eval.max_pending` in flight."""

    def __init__(self, cfg: RunConfig, evaluator: Any, runlog: RunLog | None,
                 nccl: bool) -> None:
        self.cfg, self.evaluator, self.runlog, self.nccl = cfg, evaluator, runlog, nccl
        self.pending: list[PendingEval] = []
        self.reports: list[EvalReport] = []

    def submit(self, step: int, snap: tuple[Any, list], learner: Any, done: int) -> None:
        """Hand the eval actor the weights after `step` (does not wait); `done`: the last
        recorded step."""
        self.collect(done)
        if len(self.pending) >= self.cfg.eval.max_pending:
            log.warning("eval after step %d skipped: %d evaluations still pending "
                        "(eval.max_pending)", step, len(self.pending))
            return
        version, box = snap
        if self.nccl:  # the eval actor is not in the NCCL group: it takes the object store
            version, state = learner.snapshot.options(num_returns=2).remote("solver")
            box = [state]
        self.pending.append(PendingEval(step, self.evaluator.evaluate.remote(step, version,
                                                                             box)))

    def drop_from(self, step: int) -> None:
        """Forget the evaluations of steps >= `step` (they will be run again)."""
        self.pending = [e for e in self.pending if e.step < step]

    def collect(self, done: int, timeout: float = 0.0) -> None:
        """Write the evaluations that finished (waiting at most `timeout` s) of steps up to
        `done`, in submission order; the others stay pending."""
        refs = [e.ref for e in self.pending if e.step <= done]
        if not refs:
            return
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=timeout)[0])
        keep = []
        for e in self.pending:
            if e.ref not in ready:
                keep.append(e)
                continue
            try:
                report = ray.get(e.ref)
            except RayError as exc:
                log.warning("eval after step %d failed: %s", e.step, exc)
                continue
            self.reports.append(report)
            if self.runlog is not None:
                for m in report.metrics:
                    self.runlog.write_line(m)
            log.info("eval after step %d (v%d, %.1fs): %s", report.step, report.version,
                     report.timing.seconds, " ".join(
                         f"{m.benchmark}={m.accuracy:.3f}" for m in report.metrics))
        self.pending = keep

    def finish(self, done: int) -> None:
        """At the end of the run: wait at most eval.final_wait_s for the evaluations left."""
        if not self.pending:
            return
        wait = self.cfg.eval.final_wait_s
        log.info("waiting up to %.0f s for %d evaluation(s) still running", wait,
                 len(self.pending))
        self.collect(done, wait)
        if self.pending:
            log.warning("evaluations after steps %s unfinished after %.0f s: not recorded",
                        [e.step for e in self.pending], wait)


class LeanMonitor:
    """The run's LeanFleetActor as the driver sees it: actor counts per step, history at the
    end (each call waits at most 60 s; a fleet that does not answer is logged, not fatal)."""

    def __init__(self, fleet: Any, metrics: RunMetrics | None, run_dir: Path) -> None:
        self.fleet, self.metrics = fleet, metrics
        self.path = Path(run_dir) / LEAN_FLEET_FILE
        self.history: list[tuple[float, int, int]] = []  # (t s, backlog, actors)

    def step_fields(self) -> dict[str, int]:
        """The fleet's actor count now and its peak since the last step."""
        try:
            state = ray.get(self.fleet.state.remote(), timeout=60)
        except RayError as exc:
            log.warning("Lean fleet state unavailable (%s)", type(exc).__name__)
            return {}
        log.info("Lean fleet: %d LeanVerifier actor(s) (peak %d since the last step), backlog "
                 "%d, unplaced %d", state["actors"], state["peak"], state["backlog"],
                 state["unplaced"])
        if self.metrics is not None:
            self.metrics.observe_lean(state)
        self.append_timeline()
        return {"lean_actors": state["actors"], "lean_actors_peak": state["peak"]}

    def append_timeline(self) -> int:
        """Append the fleet's timeline rows since the last call to RUN_DIR/lean_fleet.jsonl
        (`LeanFleetActor.take_timeline`); returns how many."""
        try:
            rows = ray.get(self.fleet.take_timeline.remote(), timeout=60)
        except RayError as exc:
            log.warning("Lean fleet timeline unavailable (%s)", type(exc).__name__)
            return 0
        with open(self.path, "a") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
        return len(rows)

    def finish(self) -> None:
        """The rest of the timeline, and the fleet's (t, backlog, actors) history."""
        self.append_timeline()
        try:
            self.history = ray.get(self.fleet.history.remote(), timeout=60)
        except RayError as exc:
            log.warning("Lean fleet history unavailable (%s)", type(exc).__name__)


class VerifierStats:
    """The sandbox stats of every verifier, asked for once per step without blocking."""

    def __init__(self, verifiers: list[Any], metrics: RunMetrics) -> None:
        self.verifiers, self.metrics = verifiers, metrics
        self.latest: dict[str, dict] = {}
        self._refs: dict[str, Any] = {}

    def poll(self) -> None:
        """Record the replies that arrived since the last call; ask each idle verifier again."""
        for i, actor in enumerate(self.verifiers):
            name = f"verifier-{i}"
            ref = self._refs.get(name)
            if ref is not None:
                if not ray.wait([ref], timeout=0)[0]:
                    continue  # still busy: ask again next step
                self._take(name, ref)
            self._refs[name] = actor.stats.remote()
        self._publish()

    def finish(self, timeout_s: float = 10.0) -> None:
        """Take the replies still outstanding at the end of the run (waiting at most
        `timeout_s`), so none is in flight when the actors are killed."""
        refs = dict(self._refs)
        self._refs.clear()
        if refs:
            ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        for name, ref in refs.items():
            self._take(name, ref, timeout=0)  # GetTimeoutError: left for the shutdown
        self._publish()

    def _take(self, name: str, ref: Any, timeout: float | None = None) -> None:
        try:
            self.latest[name] = ray.get(ref, timeout=timeout)
        except RayError as exc:
            log.warning("stats of %s unavailable (%s)", name, type(exc).__name__)

    def _publish(self) -> None:
        if self.latest:
            self.metrics.observe_verifiers(self.latest, time.time())


NODE_EVENTS_FILE = "nodes.jsonl"


class NodeWatch:
    """The cluster's nodes as the driver sees them, at each step and every 2 s while it
    waits for one: one log line for each node that joins or leaves (a node that leaves is
    named with the roles `placement.json` put on it), and one line per event in
    RUN_DIR/nodes.jsonl ({t: unix s, event, node_id, node_type, roles})."""

    def __init__(self, run_dir: Path, metrics: RunMetrics | None = None) -> None:
        self.path = Path(run_dir) / NODE_EVENTS_FILE
        self.metrics = metrics
        self.alive: dict[str, str] = {}
        self.alive = self._alive()
        self.events: list[dict[str, Any]] = []
        self._polled_at = time.monotonic()
        self._export([])

    def _alive(self) -> dict[str, str]:
        try:
            return {n["NodeID"]: node_kind(n) for n in ray.nodes() if n.get("Alive")}
        except RayError as exc:  # the GCS is away: keep the last view
            log.warning("cluster nodes unavailable (%s)", type(exc).__name__)
            return dict(self.alive)

    def _placed_on(self, node_id: str) -> tuple[list[str], str]:
        """The roles placement.json puts on `node_id`, and the node type they saw there."""
        try:
            placed = json.loads((self.path.parent / "placement.json").read_text())
        except (OSError, ValueError):
            return [], ""
        here = {r: loc for r, loc in placed.items() if loc.get("node_id") == node_id}
        return sorted(here), next((loc["node_type"] for loc in here.values()
                                   if loc.get("node_type")), "")

    def _export(self, lost_types: list[str]) -> None:
        """Alive nodes per type and the types just lost, to the run's Prometheus metrics."""
        if self.metrics is not None:
            self.metrics.observe_nodes(dict(Counter(self.alive.values())), lost_types)

    def lost(self) -> str:
        """The nodes that left during the run, each with its type and the roles it held, for
        an error message ('' when none left)."""
        gone = [e for e in self.events if e["event"] == "left"]
        return "; ".join(f"node {e['node_id'][:12]} ({e['node_type'] or 'unknown type'}) "
                         f"left the cluster holding {', '.join(e['roles']) or 'no actor of this run'}"
                         for e in gone)

    def poll_due(self, every_s: float = 2.0) -> list[dict[str, Any]]:
        """`poll()` when the last poll is `every_s` seconds old (the driver calls this while
        it waits for a step); [] otherwise."""
        if time.monotonic() - self._polled_at < every_s:
            return []
        return self.poll()

    def poll(self) -> list[dict[str, Any]]:
        """Compare the alive nodes with the last call's; log and record what changed."""
        self._polled_at = time.monotonic()
        now = self._alive()
        new: list[dict[str, Any]] = []
        for node_id, kind in self.alive.items():
            if node_id not in now:
                roles, placed_kind = self._placed_on(node_id)
                kind = placed_kind or kind
                log.warning("node %s (%s) left the cluster; it held %s at the run's start",
                            node_id[:12], kind, ", ".join(roles) or "no actor of this run")
                new.append({"event": "left", "node_id": node_id, "node_type": kind,
                            "roles": roles})
        for node_id, kind in now.items():
            if node_id not in self.alive:
                log.info("node %s (%s) joined the cluster", node_id[:12], kind)
                new.append({"event": "joined", "node_id": node_id, "node_type": kind,
                            "roles": []})
        self.alive = now
        self._export([e["node_type"] for e in new if e["event"] == "left"])
        if new:
            t = time.time()
            with open(self.path, "a") as fh:
                for e in new:
                    fh.write(json.dumps({"t": t, **e}) + "\n")
            self.events += new
        return new
