"""Prometheus metrics of a run, served by prometheus-client on `logging.prometheus_port`.

metrics.jsonl stays the source of truth for plots; these are for live dashboards (Grafana).
Every metric name starts with `compassplay_`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from compassplay.records import StepStats

STAGES = ("propose", "validate", "solve", "grade", "score", "learn")


class RunMetrics:
    """The run's metrics in their own registry; `serve(port)` starts the HTTP endpoint."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
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
        self.scorer_seconds = Gauge("compassplay_scorer_seconds",
                                    "gradient scorer wall seconds in the last step", registry=r)
        self.verifier_runs_per_s = Gauge("compassplay_verifier_runs_per_second",
                                         "sandbox runs per second since the last step",
                                         registry=r)
        self.verifier_runs = Gauge("compassplay_verifier_runs", "sandbox runs by status",
                                   ["status"], registry=r)
        self.verifier_actor_runs = Gauge("compassplay_verifier_actor_runs",
                                         "sandbox runs so far, per verifier actor", ["actor"],
                                         registry=r)
        self.loss = Gauge("compassplay_learner_loss", "policy loss of the last step", registry=r)
        self.grad_norm = Gauge("compassplay_learner_grad_norm", "pre-clip gradient norm",
                               registry=r)
        self.lean_actors = Gauge("compassplay_lean_actors", "LeanVerifier actors of the Lean "
                                 "fleet (task.domain=lean)", registry=r)
        self.lean_backlog = Gauge("compassplay_lean_backlog", "Lean checks submitted to the "
                                  "fleet and not finished", registry=r)
        self.steps_retried = Counter("compassplay_steps_retried",
                                     "steps resubmitted after an actor failure", registry=r)
        self._last_runs: tuple[float, int] | None = None

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)

    def observe_step(self, s: StepStats) -> None:
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
        self.scorer_seconds.set(s.stage_seconds.get("score", 0.0))
        self.loss.set(s.loss)
        self.grad_norm.set(s.grad_norm)

    def observe_lean(self, state: dict) -> None:
        """The Lean fleet's `LeanFleetActor.state()`."""
        self.lean_actors.set(state.get("actors", 0))
        self.lean_backlog.set(state.get("backlog", 0))

    def observe_verifiers(self, snapshots: dict[str, dict], now: float) -> None:
        """SandboxStats snapshots by verifier actor (the latest of each): runs by status and
        per actor, summed queue depth, and the total run rate since the last call."""
        counts: dict[str, int] = {}
        for name, snap in snapshots.items():
            for status, n in snap.get("counts", {}).items():
                counts[status] = counts.get(status, 0) + n
            self.verifier_actor_runs.labels(name).set(snap.get("runs_total", 0))
        for status, n in counts.items():
            self.verifier_runs.labels(status).set(n)
        total = sum(s.get("runs_total", 0) for s in snapshots.values())
        if self._last_runs is not None and now > self._last_runs[0]:
            self.verifier_runs_per_s.set((total - self._last_runs[1]) / (now - self._last_runs[0]))
        self._last_runs = (now, total)
        self.queue_depth.labels("verifier").set(
            sum(s.get("queue_depth", 0) for s in snapshots.values()))
