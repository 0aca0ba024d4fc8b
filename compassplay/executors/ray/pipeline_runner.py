"""Running a config on Ray: `run_pipeline` joins (or starts) the cluster, creates the run's
actors, waits until they are up, drives them with `driver.Pipeline` and always tears down what
it made (actors, metrics endpoint, run log, an embedded Ray). Progress goes to a tqdm bar
naming the step and the stage running, and to one log line per recorded step."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import ray

from compassplay.actors.placement import create_actors
from compassplay.actors.startup import wait_ready
from compassplay.actors.whereabouts import record_placement
from compassplay.config import RunConfig
from compassplay.executors.interrupt import StopRequest
from compassplay.executors.metrics import RunMetrics
from compassplay.executors.ray.dashboard_metrics import RayStepMetrics
from compassplay.executors.ray.driver import Pipeline
from compassplay.executors.ray.session import init_ray
from compassplay.plan.resources import requests
from compassplay.records import StepStats
from compassplay.rundir.runlog import RunLog
from compassplay.sync.channel import check_weight_sync

log = logging.getLogger(__name__)


def run_pipeline(cfg: RunConfig, run_dir: Path, resume: bool = False,
                 on_pipeline: Callable[[Pipeline], None] | None = None,
                 stop: StopRequest | None = None) -> Pipeline:
    """Run `cfg` on Ray (embedded or an existing cluster) and write run_dir like `local`.

    `on_pipeline` sees the Pipeline before it runs (benchmarks and fault tests use it)."""
    check_weight_sync(cfg, embedded=not (cfg.cluster.address or os.environ.get("RAY_ADDRESS")))
    embedded = init_ray(cfg)
    try:
        return _run_on_ray(cfg, run_dir, resume, on_pipeline, stop or StopRequest())
    finally:
        if embedded:
            ray.shutdown()


def _run_on_ray(cfg: RunConfig, run_dir: Path, resume: bool,
                on_pipeline: Callable[[Pipeline], None] | None, stop: StopRequest) -> Pipeline:
    from tqdm import tqdm

    runlog = RunLog(run_dir, cfg, resume=resume)
    metrics = RunMetrics.for_run(cfg)
    metrics.mirrors.append(RayStepMetrics(cfg.run.name, cfg.reward.kind))
    bar = tqdm(total=cfg.pipeline.steps, desc="self-play steps", disable=not cfg.logging.progress)

    def on_stage(step: int, stage: str) -> None:
        bar.set_description(f"step {step}: {stage or 'recording'}", refresh=True)

    def progress(stats: StepStats) -> None:
        bar.n = stats.step + 1
        bar.set_postfix(valid=stats.valid, eligible=stats.eligible,
                        reward=f"{stats.reward_mean:.3f}", loss=f"{stats.loss:.3f}")
        log.info("step %d: valid=%d eligible=%d reward=%.4f loss=%.4f v=%d", stats.step,
                 stats.valid, stats.eligible, stats.reward_mean, stats.loss,
                 stats.weight_version)

    actors = None
    try:
        if cfg.logging.prometheus_port:
            metrics.serve(cfg.logging.prometheus_port, cfg.logging.prometheus_host)
        actors = create_actors(cfg, str(run_dir), restore=resume)
        log.info("starting actors: %s", ", ".join(actors.named()))
        wait_ready(actors.named(), requests(cfg), cfg.cluster.startup_timeout_s,
                   poll=stop.check)
        record_placement(actors.named(), run_dir)
        pipeline = Pipeline(cfg, run_dir, actors, runlog, metrics, progress, stop,
                            on_stage if cfg.logging.progress else None)
        if on_pipeline is not None:
            on_pipeline(pipeline)
        pipeline.run(resume=resume)
        return pipeline
    finally:
        bar.close()
        if actors is not None:
            actors.shutdown()
        metrics.close()
        runlog.close()
