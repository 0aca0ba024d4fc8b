"""The Ray executor: the roles run as actors, wired by ObjectRefs, with bounded staleness.

Per step k the driver submits, without waiting:

    propose(k) -> validate -> solve -> grade -> score (one call per scorer shard) -> learn(k)

and then `weights()` of the learner, whose ref feeds the generators of step k+1+staleness.
Every payload moves between actors as an ObjectRef; the driver only fetches each step's small
StepResult. At most `staleness + 1` steps are in flight: with staleness 0 the run is
synchronous and equals the local executor; with staleness 1 rollout of step k+1 overlaps scoring
and learning of step k.

With `learner.weight_sync=nccl` (GPU) the learner instead broadcasts each new version to the
proposer, solver and scorers over an NCCL group (`compassplay.sync.channel`): the driver
pairs `learner.broadcast(v)` with `receive(v)` on every receiver, submitted together right
after `learn(k)`, so each receiver takes version v before its next stage call (staleness then
acts as 0: a receiver's next rollout waits for the broadcast).

Faults: verifier and scorer actors restart and Ray retries their in-flight calls (both are
idempotent). A solver death fails the steps in flight, which are resubmitted. A proposer or
learner death (they hold the task buffer and the optimizer) rolls back to the latest checkpoint.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayError

from compassplay.actors.placement import ActorSet, create_actors, requests
from compassplay.actors.startup import wait_ready
from compassplay.config import RunConfig
from compassplay.records import StepStats
from compassplay.run.interrupt import StopRequest
from compassplay.run.metrics import RunMetrics
from compassplay.run.runlog import RunLog
from compassplay.step.messages import StepResult
from compassplay.sync.channel import check_weight_sync
from compassplay.workers.learner import is_checkpoint_step, restored_buffer, restored_metrics

log = logging.getLogger(__name__)


@dataclass
class InFlight:
    """The refs of one submitted step."""

    step: int
    result: Any


class Pipeline:
    """Drives the actors of one run; `run()` returns the StepStats it recorded."""

    def __init__(self, cfg: RunConfig, run_dir: Path, actors: ActorSet, runlog: RunLog | None,
                 metrics: RunMetrics | None = None,
                 progress: Callable[[StepStats], None] | None = None,
                 stop: StopRequest | None = None) -> None:
        self.cfg, self.run_dir, self.actors = cfg, Path(run_dir), actors
        self.stop = stop or StopRequest()
        self.runlog, self.metrics, self.progress = runlog, metrics, progress
        self.recorded: list[StepStats] = []
        self.recorded_at: list[float] = []
        self.batches: dict[int, Any] = {}
        self.max_version = 0
        self.nccl = cfg.learner.weight_sync == "nccl"

    # ------------------------------------------------------------------------------- weights
    def _ask_weights(self, version: int) -> tuple[int, list, list]:
        """(version, [solver ref], [proposer ref]) of the learner's weights after its queued
        calls; with nccl sync, broadcast them now and hand the stage calls no refs ([])."""
        learner = self.actors.learner
        self.max_version = max(self.max_version, version)
        if self.nccl:
            learner.broadcast.remote(version)
            for receiver in self._receivers():
                receiver.receive.remote(version)
            return version, [], []
        solver = [learner.weights.remote("solver")]
        proposer = solver if self.cfg.learner.shared_model else [learner.weights.remote("proposer")]
        return version, solver, proposer

    def _reset_weights(self, after_step: int, version: int) -> None:
        if self.nccl:  # (re-)form the group: a restarted receiver has left the old one
            self._init_sync()
        self.weights = {after_step: self._ask_weights(version)}

    def _receivers(self) -> list[Any]:
        return [self.actors.proposer, self.actors.solver, *self.actors.scorers]

    def _init_sync(self) -> None:
        """Learner = rank 0, receivers = ranks 1..N; every member joins at once (collective)."""
        learner, receivers = self.actors.learner, self._receivers()
        addr, port = call_when_up(learner.sync_address)
        world = len(receivers) + 1
        ray.get([learner.init_sync.remote(addr, port, world)]
                + [r.init_sync.remote(addr, port, rank, world)
                   for rank, r in enumerate(receivers, start=1)])

    def _weights_for(self, step: int) -> tuple[int, list, list]:
        """The weights rollout `step` uses: those after learn(step - staleness - 1)."""
        due = step - self.cfg.pipeline.staleness - 1
        keys = [k for k in self.weights if k <= due]
        return self.weights[max(keys) if keys else min(self.weights)]

    # ------------------------------------------------------------------------------- submit
    def _submit(self, step: int) -> InFlight:
        a = self.actors
        v, w_solver, w_proposer = self._weights_for(step)
        props = a.proposer.propose.remote(step, self.batches.get(step - 1),
                                          is_checkpoint_step(self.cfg, step), v, w_proposer)
        verifier = a.verifiers[step % len(a.verifiers)]
        batch = verifier.validate.remote(props)
        attempts = a.solver.solve.remote(batch, v, w_solver)
        grades = verifier.grade.remote(batch, attempts)
        shards = [s.score.remote(batch, attempts, grades, v, w_solver) for s in a.scorers]
        result = a.learner.learn.remote(props, batch, attempts, grades, *shards)
        self.batches = {k: b for k, b in self.batches.items() if k >= step - 1}
        self.batches[step] = batch
        newest = max(self.weights)
        self.weights[step] = self._ask_weights(self.weights[newest][0] + 1)
        horizon = step - self.cfg.pipeline.staleness - 1
        self.weights = {k: w for k, w in self.weights.items() if k >= horizon or k == step}
        return InFlight(step, result)

    # ------------------------------------------------------------------------------- record
    def _record(self, result: StepResult) -> None:
        stats = result.stats
        self.recorded.append(stats)
        self.recorded_at.append(time.perf_counter())
        if self.runlog is not None:
            self.runlog.write(stats)
            self.runlog.write_samples(result.extra.get("samples", []))
        if self.metrics is not None:
            self.metrics.observe_step(stats)
            try:
                snap = ray.get(self.actors.verifiers[0].stats.remote(), timeout=5)
                self.metrics.observe_verifier(snap, time.time())
            except (RayError, TimeoutError):
                pass
        if self.progress is not None:
            self.progress(stats)

    # ------------------------------------------------------------------------------- restore
    def _start(self, restored: dict | None, base_version: int) -> int:
        """Apply a learner's restored state (or a fresh start) to the proposer and the log."""
        a = self.actors
        buffer, pending = restored_buffer(restored) if restored else (None, [])
        ray.get(a.proposer.load_buffer.remote(buffer, pending))
        if self.runlog is not None:
            self.runlog.rewind(*(restored_metrics(restored) if restored else (0, [])))
        start = restored["step"] + 1 if restored else 0
        self.batches = {}
        self._reset_weights(start - 1, base_version)
        self.proposer_incarnation = ray.get(a.proposer.incarnation.remote())
        return start

    def _recover(self, failed: int, exc: BaseException) -> int:
        """After a failed step: resubmit from it, or roll back to the latest checkpoint."""
        a = self.actors
        log.warning("step %d failed (%s); recovering", failed, type(exc).__name__)
        if self.metrics is not None:
            self.metrics.steps_retried.inc()
        done = call_when_up(a.learner.steps_done)
        same_proposer = call_when_up(a.proposer.incarnation) == self.proposer_incarnation
        if done == failed and same_proposer:
            self._reset_weights(failed - 1, call_when_up(a.learner.weight_version))
            return failed
        log.warning("learner or proposer restarted: rolling back to the latest checkpoint")
        restored = call_when_up(a.learner.restore, self.max_version + 1)
        version = call_when_up(a.learner.weight_version)
        start = self._start(restored, version)
        keep = [i for i, s in enumerate(self.recorded) if s.step < start]
        self.recorded = [self.recorded[i] for i in keep]
        self.recorded_at = [self.recorded_at[i] for i in keep]
        return start

    # ------------------------------------------------------------------------------- run
    def run(self, resume: bool = False) -> list[StepStats]:
        a = self.actors
        restored = ray.get(a.learner.restored_state.remote()) if resume else None
        step = self._start(restored, ray.get(a.learner.weight_version.remote()))
        if restored is not None:
            log.info("resumed %s at step %d", self.run_dir, step)
        pending: deque[InFlight] = deque()
        while step < self.cfg.pipeline.steps or pending:
            if step < self.cfg.pipeline.steps and len(pending) <= self.cfg.pipeline.staleness:
                pending.append(self._submit(step))
                step += 1
                if self.metrics is not None:
                    self.metrics.queue_depth.labels("steps").set(len(pending))
                continue
            oldest = pending.popleft()
            try:
                while not ray.wait([oldest.result], timeout=1.0)[0]:
                    self.stop.check()  # Ctrl-C: drop the steps in flight (run_pipeline cleans up)
                result = ray.get(oldest.result)
            except RayError as exc:
                pending.clear()
                step = self._recover(oldest.step, exc)
                continue
            self._record(result)
        return self.recorded


def call_when_up(method, *args, timeout_s: float = 300.0):
    """`ray.get(method.remote(*args))`, waiting while the actor restarts."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get(method.remote(*args))
        except (ActorUnavailableError, ActorDiedError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def init_ray(cfg: RunConfig) -> bool:
    """Connect to `cluster.address` / RAY_ADDRESS, or start an embedded local Ray.

    Returns True when this call started an embedded Ray (the caller shuts it down)."""
    if ray.is_initialized():
        return False
    import os

    address = cfg.cluster.address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address, log_to_driver=True)
        return False
    c = cfg.cluster
    need = (c.proposer.num_cpus + c.solver.num_cpus + c.verifier.num_cpus * c.num_verifiers
            + c.scorer.num_cpus * cfg.scorer.num_scorers + c.learner.num_cpus)
    ray.init(num_cpus=max(os.cpu_count() or 1, int(need + 0.999)), include_dashboard=False,
             log_to_driver=True)
    return True


def run_pipeline(cfg: RunConfig, run_dir: Path, resume: bool = False,
                 on_pipeline: Callable[[Pipeline], None] | None = None,
                 stop: StopRequest | None = None) -> Pipeline:
    """Run `cfg` on Ray (embedded or an existing cluster) and write run_dir like `local`.

    `on_pipeline` sees the Pipeline before it runs (benchmarks and fault tests use it)."""
    import os

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
    metrics = RunMetrics()
    if cfg.logging.prometheus_port:
        metrics.serve(cfg.logging.prometheus_port, cfg.logging.prometheus_host)
        log.info("prometheus metrics on http://%s:%d/metrics", cfg.logging.prometheus_host,
                 cfg.logging.prometheus_port)
    bar = tqdm(total=cfg.pipeline.steps, desc="self-play steps", disable=not cfg.logging.progress)

    def progress(stats: StepStats) -> None:
        bar.n = stats.step + 1
        bar.set_postfix(valid=stats.valid, eligible=stats.eligible,
                        reward=f"{stats.reward_mean:.3f}", loss=f"{stats.loss:.3f}")
        log.info("step %d: valid=%d eligible=%d reward=%.4f loss=%.4f v=%d", stats.step,
                 stats.valid, stats.eligible, stats.reward_mean, stats.loss,
                 stats.weight_version)

    actors = None
    try:
        actors = create_actors(cfg, str(run_dir), restore=resume)
        log.info("starting actors: %s", ", ".join(actors.named()))
        wait_ready(actors.named(), requests(cfg), cfg.cluster.startup_timeout_s,
                   poll=stop.check)
        pipeline = Pipeline(cfg, run_dir, actors, runlog, metrics, progress, stop)
        if on_pipeline is not None:
            on_pipeline(pipeline)
        pipeline.run(resume=resume)
        return pipeline
    finally:
        bar.close()
        if actors is not None:
            actors.shutdown()
        runlog.close()
