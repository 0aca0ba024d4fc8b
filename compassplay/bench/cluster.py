"""`compassplay bench cluster`: the multi-node path on one machine, as figures.

Starts a cluster grown by Ray's real autoscaler from the node types of `ray_cluster.yaml`
(`bench.fake_cluster`: no worker node at first; the GCS marks a lost node dead after 3 missed
1-s health checks) and measures, in one run:

- **placement**: one probe actor per worker node type, all asked for at once from zero worker
  nodes; seconds from the ask (the demand) to the actor answering on a node of its type, the
  autoscaler's launch included;
- **kills**: `--config` (default `cluster_local`, the micro model) for `--steps` steps, once
  per `--kill` role, SIGKILLing the node that role sits on (`FakeCluster.kill_node`: its raylet
  and every process under it) once step 0 is recorded. Against the local executor on the same
  config and seed: steps completed, tasks lost and tasks counted twice (samples.jsonl
  `(step, task_id)` pairs missing from or added to the local run's), and step rows whose
  figures differ (timings and weight versions aside: a learner restored from a checkpoint
  publishes fresh versions);
- **resume**: the same run stopped after step 1 (a stop request, as Ctrl-C or `ray job stop`
  gives) and resumed in a new driver from its last checkpoint; the same comparisons;
- **nodes**: worker nodes launched per type (every node seen alive during the bench; a killed
  node's replacement counts) and the resumed run's actors per node (`placement.json`).

Prints one JSON object with `--json`; exits 1 when a task is lost or counted twice, a step
is missing, or a figure differs. A few minutes on 2 cores.

    compassplay bench cluster --json
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from compassplay.actors.whereabouts import here
from compassplay.bench.fake_cluster import FakeCluster, wait_for
from compassplay.bench.fake_node_types import HEAD_TYPE, node_type_of
from compassplay.config import load_config
from compassplay.errors import RunInterrupted
from compassplay.executors.interrupt import StopRequest
from compassplay.rundir.runlog import METRICS_FILE, comparable_steps, read_metrics

log = logging.getLogger(__name__)

# the GCS marks a node dead after 3 missed 1-s health checks (Ray's defaults take ~30 s)
FAST_HEALTH_CHECKS = {"RAY_health_check_period_ms": "1000",
                      "RAY_health_check_timeout_ms": "1000",
                      "RAY_health_check_failure_threshold": "3"}
# what a probe actor asks for to land on each node type of ray_cluster.yaml
PROBE_ASKS = {"gpu_worker": {"num_gpus": 1, "resources": {"trainer_node": 1}},
              "python_verifier": {"resources": {"python_verifier": 1}},
              "lean_verifier": {"resources": {"lean_repl": 1}}}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench cluster`."""
    parser.add_argument("--config", default="cluster_local", help="shipped name or YAML path")
    parser.add_argument("--steps", type=int, default=3, help="steps of each run (>= 2)")
    parser.add_argument("--kill", default="verifier-0,learner",
                        help="comma-separated roles whose node is killed, one run each "
                             "('' = none)")
    parser.add_argument("--idle-timeout-s", type=float, default=6.0,
                        help="seconds an idle worker node lives before the autoscaler "
                             "removes it")
    parser.add_argument("overrides", nargs="*", help="dotted KEY=VALUE overrides")
    parser.add_argument("--json", action="store_true", help="print only the JSON object")


class NodeKiller(threading.Thread):
    """Kills the node `role` sits on (per RUN_DIR/placement.json) once step 0 is recorded;
    `killed` is its node id, `steps_before_kill` the steps recorded when it died."""

    def __init__(self, cluster: FakeCluster, run_dir: Path, role: str,
                 timeout_s: float = 300.0) -> None:
        super().__init__(daemon=True)
        self.cluster, self.run_dir, self.role, self.timeout_s = cluster, run_dir, role, timeout_s
        self.killed: str | None = None
        self.killed_at = 0.0  # time.monotonic() once the node is killed
        self.steps_before_kill = -1
        self.error: BaseException | None = None

    def _steps_recorded(self) -> int:
        path = self.run_dir / METRICS_FILE
        return len(read_metrics(path)) if path.exists() else 0

    def run(self) -> None:
        try:
            wait_for("step 0 recorded", lambda: self._steps_recorded() >= 1, self.timeout_s,
                     poll_s=0.2)
            placed = json.loads((self.run_dir / "placement.json").read_text())
            if self.role not in placed:
                raise KeyError(f"no role {self.role!r} in placement.json (roles: "
                               f"{', '.join(sorted(placed))})")
            self.steps_before_kill = self._steps_recorded()
            self.killed = placed[self.role]["node_id"]
            self.cluster.kill_node(self.killed)
            self.killed_at = time.monotonic()
        except BaseException as exc:  # noqa: BLE001 -- reported by the caller
            self.error = exc


def task_keys(run_dir: Path) -> Counter[tuple[int, str]]:
    """The (step, task_id) pairs of a run's samples.jsonl, with multiplicity."""
    path = Path(run_dir) / "samples.jsonl"
    if not path.exists():
        return Counter()
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return Counter((int(r["step"]), str(r.get("task_id", ""))) for r in rows)


def compare_runs(run_dir: Path, baseline_dir: Path) -> dict[str, Any]:
    """A run against the baseline run of the same config and seed: steps completed, tasks
    lost and counted twice, and the step rows whose figures differ (timing and weight
    versions aside), with the first differing fields."""
    def rows(d: Path) -> list[dict]:
        path = d / METRICS_FILE
        return [{k: v for k, v in r.items() if not k.endswith("weight_version")}
                for r in (comparable_steps(path) if path.exists() else [])]

    got, want = rows(run_dir), rows(baseline_dir)
    mine, theirs = task_keys(run_dir), task_keys(baseline_dir)
    differ = [i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b]
    first = ([k for k in want[differ[0]] if got[differ[0]].get(k) != want[differ[0]][k]]
             if differ else [])
    return {"steps_completed": len(got), "steps_expected": len(want),
            "tasks_lost": sum((theirs - mine).values()),
            "tasks_counted_twice": sum((mine - theirs).values()),
            "tasks": sum(theirs.values()), "rows_differing": len(differ),
            "first_differing_fields": first[:8]}


def _clean(cmp: dict[str, Any]) -> bool:
    return (cmp["steps_completed"] == cmp["steps_expected"] and cmp["tasks_lost"] == 0
            and cmp["tasks_counted_twice"] == 0 and cmp["rows_differing"] == 0)


def probe_placement(cluster: FakeCluster, timeout_s: float = 180.0) -> dict[str, float]:
    """Seconds from asking for one actor per node type (all at once, from zero worker nodes)
    to each answering on a node of its type; the probes are killed afterwards."""
    import ray

    @ray.remote(num_cpus=0.25)
    class Probe:
        def where(self) -> str:
            return here()["node_type"]

    asks = {t: a for t, a in PROBE_ASKS.items() if t in cluster.node_types}
    t0 = time.monotonic()
    probes = {t: Probe.options(**a).remote() for t, a in asks.items()}
    pending = {probes[t].where.remote(): t for t in probes}
    out: dict[str, float] = {}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.1, timeout_s -
                                                                     (time.monotonic() - t0)))
        if not done:
            raise TimeoutError(f"probes for {sorted(pending.values())} not placed in "
                               f"{timeout_s:.0f} s")
        kind = pending.pop(done[0])
        landed = ray.get(done[0])
        if landed != kind:
            raise RuntimeError(f"a probe asking {asks[kind]} landed on {landed!r}, not {kind}")
        out[kind] = round(time.monotonic() - t0, 2)
    for p in probes.values():
        ray.kill(p)
    return out


def actors_per_node(run_dir: Path) -> dict[str, list[str]]:
    """placement.json as node ("type:node id") -> the roles on it."""
    placed = json.loads((Path(run_dir) / "placement.json").read_text())
    out: dict[str, list[str]] = {}
    for role, loc in sorted(placed.items()):
        out.setdefault(f"{loc.get('node_type') or '?'}:{loc['node_id']}", []).append(role)
    return out


class NodeTally(threading.Thread):
    """Every worker node seen alive while it runs, by node id and type (a dead node's entry in
    `ray.nodes()` no longer lists its resources, so its type is read while it lives)."""

    def __init__(self, cluster: FakeCluster, poll_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.cluster, self.poll_s = cluster, poll_s
        self.seen: dict[str, str] = {}
        self._stop = threading.Event()

    def run(self) -> None:
        import ray

        while not self._stop.wait(self.poll_s):
            try:
                nodes = ray.nodes()
            except Exception:  # noqa: BLE001 -- the next poll tries again
                continue
            for n in nodes:
                if n.get("Alive") and n["NodeID"] not in self.seen:
                    self.seen[n["NodeID"]] = node_type_of(n, self.cluster.node_types)

    def launched(self) -> dict[str, int]:
        """Worker nodes per type seen so far (the head aside)."""
        self._stop.set()
        counts = Counter(self.seen.values())
        return {k: v for k, v in sorted(counts.items()) if k != HEAD_TYPE}


class _StopAfter:
    """on_pipeline hook: asks the run to stop once step `step` is recorded."""

    def __init__(self, stop: Any, step: int) -> None:
        self.stop, self.step = stop, step

    def __call__(self, pipe: Any) -> None:
        record = pipe._record

        def record_then_stop(result: Any) -> None:
            record(result)
            if result.stats.step >= self.step:
                self.stop.presses += 1  # what the first Ctrl-C or SIGTERM does
        pipe._record = record_then_stop


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the cluster, measure, stop it; returns the JSON-ready figures."""
    import ray

    from compassplay.executors.local import LocalExecutor  # lazy: pulls torch
    from compassplay.executors.ray.pipeline_runner import run_pipeline  # lazy: pulls torch

    if args.steps < 2:
        raise ValueError(f"--steps must be >= 2 (a kill after step 0, a resume after step 1), "
                         f"got {args.steps}")
    overrides = [*args.overrides, f"pipeline.steps={args.steps}", "logging.progress=false",
                 "learner.checkpoint_every=1"]
    cfg = load_config(args.config, overrides)
    roles = [r for r in args.kill.split(",") if r.strip()]
    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    t_start = time.monotonic()
    LocalExecutor(cfg, work / "local").run()
    out: dict[str, Any] = {"config": args.config, "steps": args.steps, "work_dir": str(work),
                           "local_s": round(time.monotonic() - t_start, 1)}
    cluster = FakeCluster(idle_timeout_s=args.idle_timeout_s, env=dict(FAST_HEALTH_CHECKS))
    cluster.start()
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        tally = NodeTally(cluster)
        tally.start()
        out["seconds_demand_to_placed"] = probe_placement(cluster)
        kills: dict[str, Any] = {}
        for role in roles:
            t0 = time.monotonic()
            run_dir = work / f"kill-{role}"
            killer = NodeKiller(cluster, run_dir, role)
            killer.start()
            error = ""
            try:
                run_pipeline(cfg, run_dir)
            except Exception as exc:  # noqa: BLE001 -- reported as a figure
                error = f"{type(exc).__name__}: {exc}"[:500]
            killer.join(timeout=30)
            kills[role] = {"killed_node": killer.killed or "",
                           "steps_before_kill": killer.steps_before_kill,
                           "error": error or (repr(killer.error) if killer.error else ""),
                           "wall_s": round(time.monotonic() - t0, 1),
                           **compare_runs(run_dir, work / "local")}
            log.info("bench cluster: %s's node killed: %s", role, kills[role])
        out["kills"] = kills
        t0 = time.monotonic()
        run_dir, stop = work / "resume", StopRequest()
        stopped_after = -1
        try:
            run_pipeline(cfg, run_dir, on_pipeline=_StopAfter(stop, 1), stop=stop)
        except RunInterrupted:
            stopped_after = len(read_metrics(run_dir / METRICS_FILE)) - 1
        run_pipeline(cfg, run_dir, resume=True)
        out["resume"] = {"stopped_after_step": stopped_after,
                         "wall_s": round(time.monotonic() - t0, 1),
                         **compare_runs(run_dir, work / "local")}
        out["actors_per_node"] = actors_per_node(run_dir)
        out["nodes_launched"] = tally.launched()
    finally:
        ray.shutdown()
        cluster.stop()
    out["tasks_lost"] = sum(k["tasks_lost"] for k in out["kills"].values()) + \
        out["resume"]["tasks_lost"]
    out["resume_diffs"] = out["resume"]["rows_differing"]
    out["ok"] = all(_clean(k) and not k["error"] for k in out["kills"].values()) and \
        _clean(out["resume"]) and out["resume"]["stopped_after_step"] >= 1
    out["wall_s"] = round(time.monotonic() - t_start, 1)
    return out


def exit_code(result: dict[str, Any]) -> int:
    """1 when a run lost or doubled a task, missed a step or differed from the local run."""
    return 0 if result.get("ok") else 1
