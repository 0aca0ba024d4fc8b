"""Prometheus metrics of a run, served by prometheus-client on `logging.prometheus_port`.

metrics.jsonl stays the source of truth for plots; these are for live dashboards (Grafana).
Every metric name starts with `compassplay_`; every served series carries the labels `run`
(the run's name) and `reward` (reward.kind), so the runs of one head node stay apart. Both
executors serve them. A port already taken (another job on the same node) is not an error:
the next free port up to `PORT_TRIES` ports on is used instead, and logged.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from compassplay.errors import RunError
from compassplay.records import StepStats

log = logging.getLogger(__name__)

PORT_TRIES = 20  # ports tried from logging.prometheus_port on when it is taken


class _Labelled(Collector):
    """Every sample of `inner` with `labels` added (the served view of a run's registry)."""

    def __init__(self, inner: CollectorRegistry, labels: dict[str, str]) -> None:
        self.inner, self.labels = inner, labels

    def collect(self) -> Iterator[Metric]:
        for fam in self.inner.collect():
            out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            out.samples = [s._replace(labels={**self.labels, **s.labels}) for s in fam.samples]
            yield out

STAGES = ("propose", "validate", "solve", "grade", "score", "learn")


class RunMetrics:
    """The run's metrics in their own registry (`registry`, unlabelled); `serve(port)` starts
    the HTTP endpoint of `served`: the same series with the run's `run` and `reward` labels."""

    def __init__(self, run: str = "", reward: str = "") -> None:
        r = self.registry = CollectorRegistry()
        self.served = CollectorRegistry()
        self.served.register(_Labelled(r, {"run": run, "reward": reward}))
        self.port: int | None = None
        self._server = None
        # more sinks for each step (the Ray executor adds Ray's own metrics): observe_step(s)
        self.mirrors: list = []
        self.step = Gauge("compassplay_step", "last completed self-play step", registry=r)
        self.weight_version = Gauge("compassplay_weight_version",
                                    "learner weight version after the last step", registry=r)
        self.queue_depth = Gauge("compassplay_queue_depth", "steps or calls in flight",
                                 ["queue"], registry=r)
        self.stage_seconds = Histogram(
            "compassplay_stage_seconds", "wall seconds per stage per step", ["stage"],
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900), registry=r)
        self.proposals = Counter("compassplay_proposals", "proposals written", registry=r)
        self.valid = Counter("compassplay_valid", "well-posed proposals", registry=r)
        self.eligible = Counter("compassplay_eligible", "eligible (0<s<1) proposals", registry=r)
        self.solve_rate = Histogram("compassplay_solve_rate", "solver success rate per task",
                                    buckets=(0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75,
                                             0.875, 1.0), registry=r)
        self.reward_mean = Gauge("compassplay_reward_mean", "mean proposer reward", registry=r)
        self.reward_distinct = Gauge("compassplay_reward_distinct",
                                     "distinct proposer reward values among eligible candidates",
                                     registry=r)
        self.score_share = Gauge("compassplay_score_advantage_share",
                                 "share of the proposer's advantage variance that the reward's "
                                 "score decides (between eligible candidates) in the last step",
                                 registry=r)
        self.scorer_seconds = Gauge("compassplay_scorer_seconds",
                                    "gradient scorer wall seconds in the last step", registry=r)
        self.verifier_runs_per_s = Gauge("compassplay_verifier_runs_per_second",
                                         "sandbox runs per second since the last step",
                                         registry=r)
        self.verifier_runs = Counter("compassplay_verifier_runs", "sandbox runs by status",
                                     ["status"], registry=r)
        self.verifier_actor_runs = Counter("compassplay_verifier_actor_runs",
                                           "sandbox runs, per verifier actor", ["actor"],
                                           registry=r)
        self._seen: dict[tuple[str, str], int] = {}  # cumulative counts already counted
        self.loss = Gauge("compassplay_learner_loss", "policy loss of the last step", registry=r)
        self.grad_norm = Gauge("compassplay_learner_grad_norm", "pre-clip gradient norm",
                               registry=r)
        self.lean_actors = Gauge("compassplay_lean_actors", "LeanVerifier actors of the Lean "
                                 "fleet (task.domain=lean)", registry=r)
        self.lean_backlog = Gauge("compassplay_lean_backlog", "Lean checks submitted to the "
                                  "fleet and not finished", registry=r)
        self.steps_retried = Counter("compassplay_steps_retried",
                                     "steps resubmitted after an actor failure", registry=r)
        self.nodes = Gauge("compassplay_nodes", "alive Ray nodes by node type, as the driver "
                           "last saw them (Ray executor)", ["node_type"], registry=r)
        self.nodes_lost = Counter("compassplay_nodes_lost", "Ray nodes that left the cluster "
                                  "during the run, by node type", ["node_type"], registry=r)
        self._last_runs: tuple[float, int] | None = None
        self._node_types: set[str] = set()  # every node type seen alive (gauged 0 once gone)

    @classmethod
    def for_run(cls, cfg) -> RunMetrics:
        """The metrics of the run `cfg` (labels: run.name, reward.kind)."""
        return cls(run=cfg.run.name, reward=cfg.reward.kind)

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve `served` on http://host:port/metrics, or on the next free port (at most
        `PORT_TRIES` on) when `port` is taken; returns the port. RunError when none is free."""
        for p in range(port, min(port + PORT_TRIES, 65536)):
            try:
                self._server, _ = start_http_server(p, addr=host, registry=self.served)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise RunError(f"logging.prometheus_host={host!r}, "
                                   f"logging.prometheus_port={p}: cannot serve metrics "
                                   f"({exc})") from None
                continue
            if p != port:
                log.warning("prometheus port %d is taken (another run on this node?): "
                            "serving on %d instead", port, p)
            self.port = p
            log.info("prometheus metrics on http://%s:%d/metrics", host, p)
            return p
        raise RunError(f"logging.prometheus_port: ports {port}-{port + PORT_TRIES - 1} on "
                       f"{host} are all taken; set another port, or 0 for no endpoint")

    def close(self) -> None:
        """Stop serving (the port is free again)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def observe_step(self, s: StepStats) -> None:
        for mirror in self.mirrors:
            mirror.observe_step(s)
        self.step.set(s.step)
        self.weight_version.set(s.weight_version)
        for stage in STAGES:
            if stage in s.stage_seconds:
                self.stage_seconds.labels(stage).observe(s.stage_seconds[stage])
        self.proposals.inc(s.proposals)
        self.valid.inc(s.valid)
        self.eligible.inc(s.eligible)
        for rate in s.solve_rates:
            self.solve_rate.observe(rate)
        self.reward_mean.set(s.reward_mean)
        self.reward_distinct.set(s.reward_distinct)
        if s.score_advantage_share is not None:
            self.score_share.set(s.score_advantage_share)
        self.scorer_seconds.set(s.stage_seconds.get("score", 0.0))
        self.loss.set(s.loss)
        self.grad_norm.set(s.grad_norm)

    def observe_lean(self, state: dict) -> None:
        """The Lean fleet's `LeanFleetActor.state()`."""
        self.lean_actors.set(state.get("actors", 0))
        self.lean_backlog.set(state.get("backlog", 0))

    def observe_nodes(self, alive_by_type: dict[str, int], lost_types: list[str]) -> None:
        """The cluster's alive nodes per type now, and the types of nodes that just left."""
        for kind in self._node_types - set(alive_by_type):
            self.nodes.labels(kind).set(0)
        for kind, n in alive_by_type.items():
            self.nodes.labels(kind).set(n)
        self._node_types |= set(alive_by_type)
        for kind in lost_types:
            self.nodes_lost.labels(kind).inc()

    def observe_verifiers(self, snapshots: dict[str, dict], now: float) -> None:
        """SandboxStats snapshots by verifier actor (the latest of each): runs by status and
        per actor, summed queue depth, and the total run rate since the last call."""
        counts: dict[str, int] = {}
        for name, snap in snapshots.items():
            for status, n in snap.get("counts", {}).items():
                counts[status] = counts.get(status, 0) + n
            self._count(self.verifier_actor_runs, "actor", name, snap.get("runs_total", 0))
        for status, n in counts.items():
            self._count(self.verifier_runs, "status", status, n)
        total = sum(s.get("runs_total", 0) for s in snapshots.values())
        if self._last_runs is not None and now > self._last_runs[0]:
            self.verifier_runs_per_s.set((total - self._last_runs[1]) / (now - self._last_runs[0]))
        self._last_runs = (now, total)
        self.queue_depth.labels("verifier").set(
            sum(s.get("queue_depth", 0) for s in snapshots.values()))

    def _count(self, counter: Counter, kind: str, label: str, total: int) -> None:
        """Advance `counter{label}` to a cumulative `total`; a total that went down (an actor
        restarted and counts from 0 again) counts from its new value on."""
        key = (kind, label)
        before = self._seen.get(key, 0)
        counter.labels(label).inc(total - before if total >= before else total)
        self._seen[key] = total
