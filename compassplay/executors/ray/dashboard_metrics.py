"""The run's step metrics as Ray metrics (`ray.util.metrics`), for the Ray dashboard.

Each step line's top-level scalars of metrics.jsonl (`rundir.tracking.scalars`: reward_mean,
loss, entropy, ...) are set on Ray gauges named `compassplay_<field>` with the tags `run`
(run.name) and `reward` (reward.kind). Ray's metrics agent on the driver's node exports them
(as `ray_compassplay_<field>`, about every 10 s) on the node's metrics export port, the one
the Ray dashboard's Prometheus/Grafana views read. The driver's own Prometheus endpoint
(`executors.metrics`) stays the place for the full set, histograms included.
"""

from __future__ import annotations

from ray.util.metrics import Gauge

from compassplay.records import StepStats
from compassplay.rundir.tracking import scalars

TAG_KEYS = ("run", "reward")


class RayStepMetrics:
    """Ray gauges fed with each recorded step (`observe_step`), tagged with run and reward."""

    def __init__(self, run: str, reward: str) -> None:
        self.tags = {"run": run, "reward": reward}
        self.gauges: dict[str, Gauge] = {}

    def observe_step(self, stats: StepStats) -> None:
        for name, value in scalars(stats.model_dump(mode="json")).items():
            if "/" in name:  # per-stage and per-task-type breakdowns stay in TensorBoard
                continue
            gauge = self.gauges.get(name)
            if gauge is None:
                gauge = self.gauges[name] = Gauge(
                    f"compassplay_{name}", description=f"StepStats.{name} of the last step "
                    "(metrics.jsonl)", tag_keys=TAG_KEYS)
            gauge.set(value, tags=self.tags)
