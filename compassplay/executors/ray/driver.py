"""The Ray executor: the step graph run as actor calls, wired by ObjectRefs, bounded staleness.

Per step k the driver submits, without waiting, the stages of `step.graph.STEP` as actor
calls (`RayDispatch`): propose -> validate (on every verifier) -> update_buffer -> collect ->
solve -> grade (every verifier) -> candidates -> score (every scorer shard) -> learn; then asks the
learner for a snapshot of its weights, (version, state) as two ObjectRefs (the state one
packed buffer, `sync.packed`, that each receiver maps from the object store without a copy),
and reports it to the `VersionGate`, which says which snapshot the rollout of each later step may use. Every
payload moves between actors as an ObjectRef; the driver only fetches each step's small
StepResult. At most `staleness + 1` steps are in flight: with staleness 0 the run is
synchronous and equals the local executor; with staleness 1 rollout of step k+1 overlaps
scoring and learning of step k.

With `learner.weight_sync=nccl` (GPU) the learner instead broadcasts each new version to the
proposer, solver and scorers over an NCCL group (`compassplay.sync.channel`): the driver
submits `learner.broadcast()` and `receive()` on every receiver together right after
`learn(k)`, with no ObjectRef between them (each receiver takes the version the broadcast's
header carries and refuses an older one), so sender and receivers meet in the collective;
each receiver takes the new version before its next stage call (staleness then acts as 0).
The next broadcast first waits for the previous one's calls (`_settle_sync`). Ranks: the learner is 0, each
receiver a block of its own, a vLLM engine one rank per TP worker (`sync.ranks`).

With `learner.weight_sync=ipc` (vLLM engines colocated on the learner's GPU, sleeping between
rollouts) the snapshot still goes through the object store for HF roles and scorers, and the
driver pairs `learner.publish_ipc()` with `receive_ipc` on each vLLM generator, then
`learner.release_ipc(...)` once they all loaded (the learner's next call waits for that).

Evaluation during training (`eval.every_steps` = k > 0): after submitting every k-th step the
driver hands the eval actor the same learner snapshot the gate gets (with nccl sync, an
object-store snapshot of its own), without waiting. Each recorded step collects the finished
evaluations (`ray.wait(timeout=0)`) and writes them as "eval" lines with their step and
version; at the end the driver waits at most `eval.final_wait_s` for those still running.

Lean (task.domain=lean, verifiers.lean.backend=fleet): the verifier actors send their Lean
checks to the run's LeanFleetActor (`actors.lean.fleet_actor`), which grows and shrinks a set of
LeanVerifier actors with the backlog. Each recorded step gets the fleet's actor count
(`lean_actors`, and `lean_actors_peak` since the previous step), and the fleet's timeline
(backlog, actors, placed actors, alive nodes per type, seconds from demand to a started actor)
is appended to lean_fleet.jsonl (plotted to lean_fleet.png at the end). A fleet that cannot
place an actor within `verifiers.lean.resource_wait_s` stops the run with a message naming the resource (no retry).

Faults: verifier and scorer actors restart and Ray retries their in-flight calls (both are
idempotent). A solver death fails the steps in flight, which are resubmitted. A proposer or
learner death (they hold the task buffer and the optimizer) rolls back to the latest checkpoint.
A learner group of N > 1 ranks (`learner.num_ranks`, `actors.learner_group`) does not restart
rank by rank: when one of its ranks died, the driver replaces the whole group (same placement
group) by one that restores the latest checkpoint.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayError

from compassplay.actors.placement import ActorSet, create_learner
from compassplay.actors.startup import describe_cause, failed_call, wait_ready
from compassplay.config import RunConfig
from compassplay.errors import RunError
from compassplay.executors.interrupt import StopRequest
from compassplay.executors.metrics import RunMetrics
from compassplay.executors.ray.dispatch import InFlight, RayDispatch, is_fatal
from compassplay.executors.ray.monitors import EvalQueue, LeanMonitor, NodeWatch, VerifierStats
from compassplay.executors.ray.session import call_when_up
from compassplay.executors.ray.traffic import TrafficLog
from compassplay.plan.resources import requests
from compassplay.records import StepStats
from compassplay.rundir.runlog import RunLog
from compassplay.step.graph import submit_step
from compassplay.step.messages import StepResult
from compassplay.sync.ranks import receiver_sizes, weight_sync_ranks
from compassplay.sync.version_gate import VersionGate
from compassplay.workers.eval_worker import EvalReport, eval_due
from compassplay.workers.learner_worker import (
    is_checkpoint_step,
    restored_env_state,
    restored_metrics,
)

log = logging.getLogger(__name__)


class Pipeline:
    """Drives the actors of one run; `run()` returns the StepStats it recorded."""

    def __init__(self, cfg: RunConfig, run_dir: Path, actors: ActorSet, runlog: RunLog | None,
                 metrics: RunMetrics | None = None,
                 progress: Callable[[StepStats], None] | None = None,
                 stop: StopRequest | None = None,
                 on_stage: Callable[[int, str], None] | None = None) -> None:
        self.cfg, self.run_dir, self.actors = cfg, Path(run_dir), actors
        self.runlog, self.metrics, self.progress = runlog, metrics, progress
        self.on_stage = on_stage  # (step, stage running now), about once a second
        self.stop = stop or StopRequest()
        self.dispatch = RayDispatch(actors)
        self.gate: VersionGate[dict] = VersionGate(cfg.pipeline.staleness)
        self.recorded: list[StepStats] = []
        self.recorded_at: list[float] = []
        self.started_at = time.perf_counter()  # reset by `run` (`wall_seconds`)
        self.nccl = cfg.learner.weight_sync == "nccl"
        self.ipc = cfg.learner.weight_sync == "ipc"
        self.sync_calls: list = []  # the last weight broadcast's calls (learner, receivers)
        self.failures: dict[int, int] = {}  # step -> failures so far
        self.evals = EvalQueue(cfg, actors.evaluator, runlog, self.nccl)
        self.lean = None if actors.lean_fleet is None else LeanMonitor(actors.lean_fleet,
                                                                       metrics, self.run_dir)
        self.verifiers = None if metrics is None else VerifierStats(actors.verifiers, metrics)
        self.nodes = NodeWatch(self.run_dir, metrics)
        self.traffic = TrafficLog(self.run_dir)

    @property
    def eval_reports(self) -> list[EvalReport]:
        return self.evals.reports

    @property
    def verifier_stats(self) -> dict[str, dict]:
        return self.verifiers.latest if self.verifiers is not None else {}

    @property
    def lean_history(self) -> list[tuple[float, int, int]]:
        """The Lean fleet's (t s, backlog, actors) changes, read at the end of the run."""
        return self.lean.history if self.lean is not None else []

    def _done(self) -> int:
        """The last recorded step (-1 before any)."""
        return max((s.step for s in self.recorded), default=-1)

    # ------------------------------------------------------------------------------- weights
    def _snapshot(self) -> dict[str, tuple[Any, list]]:
        """The learner's weights after its queued calls, as the gate hands them out: per
        role (version ref, [state ref]); with nccl sync, broadcast them now (state: [])."""
        learner = self.actors.learner
        if self.nccl:
            self._settle_sync()
            version = learner.broadcast.remote()
            # No ObjectRef argument: Ray would start each receiver only after the broadcast
            # returned, while a broadcast of more than one bucket waits for the receivers.
            self.sync_calls = [version] + [r.receive.remote() for r in self._receivers()]
            return {"solver": (version, []), "proposer": (version, [])}
        if self.ipc:
            update = learner.publish_ipc.remote()
            loaded = [a.receive_ipc.remote(update) for a in self._vllm_generators()]
            learner.release_ipc.remote(*loaded)
        out = {}
        for role in ("solver", "proposer"):
            if role == "proposer" and self.cfg.learner.shared_model:
                out[role] = out["solver"]
                continue
            version, state = learner.snapshot.options(num_returns=2).remote(role)
            out[role] = (version, [state])
        if self.cfg.reward.needs.metric:  # the weights plus the optimizer metric (precond_cosine)
            version, state = learner.snapshot.options(num_returns=2).remote("scorer")
            out["scorer"] = (version, [state])
        return out

    def _settle_sync(self, log_every_s: float = 60.0) -> None:
        """Wait for the previous broadcast's calls (learner and every receiver) and raise
        the first failure; logs what it waits for every `log_every_s`."""
        pending, started = list(self.sync_calls), time.monotonic()
        last = started
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
            self.stop.check()
            if pending and time.monotonic() - last >= log_every_s:
                last = time.monotonic()
                log.info("waiting %.0f s for the weight broadcast: %d of its calls (learner "
                         "and receivers) still running", last - started, len(pending))
        calls, self.sync_calls = self.sync_calls, []
        ray.get(calls)

    def _reset_weights(self, after_step: int) -> None:
        if self.nccl:  # (re-)form the group: a restarted receiver has left the old one
            self.sync_calls = []  # calls of the old group: their failure is why we are here
            self._init_sync()
        self.gate.reset(after_step, self._snapshot())

    def _receivers(self) -> list[Any]:
        """In `sync.ranks.receiver_sizes` order: proposer, solver, scorers."""
        return [self.actors.proposer, self.actors.solver, *self.actors.scorers]

    def _vllm_generators(self) -> list[Any]:
        return [a for a, sec in ((self.actors.proposer, self.cfg.proposer),
                                 (self.actors.solver, self.cfg.solver)) if sec.engine == "vllm"]

    def _init_sync(self) -> None:
        """Learner = rank 0, each receiver a block of ranks (a vLLM engine one per TP worker,
        `sync.ranks`); every member joins at once (collective)."""
        learner, receivers = self.actors.learner, self._receivers()
        addr, port = call_when_up(learner.sync_address, poll=self.stop.check)
        offsets, world = weight_sync_ranks(receiver_sizes(self.cfg))
        ray.get([learner.init_sync.remote(addr, port, world)]
                + [r.init_sync.remote(addr, port, offset, world)
                   for offset, r in zip(offsets, receivers, strict=True)])

    # ------------------------------------------------------------------------------- submit
    def _submit(self, step: int) -> InFlight:
        handles = submit_step(step, self.dispatch, self.gate.for_rollout(step),
                              is_checkpoint_step(self.cfg, step), self.cfg.task.domain)
        snap = self._snapshot()
        self.gate.report(step, snap)
        if self.actors.evaluator is not None and eval_due(self.cfg, step):
            self.evals.submit(step, snap["solver"], self.actors.learner, self._done())
        return InFlight(step, handles["learn"], handles)

    # ------------------------------------------------------------------------------- record
    def _record(self, result: StepResult) -> None:
        stats = result.stats
        if self.lean is not None:
            stats = stats.model_copy(update=self.lean.step_fields())
        now = time.perf_counter()
        last = self.recorded_at[-1] if self.recorded_at else self.started_at
        stats = stats.model_copy(update={"wall_seconds": now - last})
        self.recorded.append(stats)
        self.recorded_at.append(now)
        self.nodes.poll()
        if self.runlog is not None:
            self.runlog.write(stats)
            self.runlog.write_samples(result.extra.get("samples", []))
        if self.metrics is not None:
            self.metrics.observe_step(stats)
            self.verifiers.poll()
        self.evals.collect(self._done())
        if self.progress is not None:
            self.progress(stats)

    # ------------------------------------------------------------------------------- restore
    def _start(self, restored: dict | None) -> int:
        """Apply a learner's restored state (or a fresh start) to the proposer and the log."""
        a = self.actors
        ray.get(a.proposer.load_env_state.remote(restored_env_state(restored) if restored
                                                 else None))
        if self.runlog is not None:
            self.runlog.rewind(*(restored_metrics(restored) if restored else (0, [])))
        start = restored["step"] + 1 if restored else 0
        self._reset_weights(start - 1)
        self.proposer_incarnation = ray.get(a.proposer.incarnation.remote())
        return start

    def _recover(self, failed: int, exc: BaseException) -> int:
        """After a failed step: resubmit from it, or roll back to the latest checkpoint.
        A step that fails `pipeline.max_step_retries` times in a row ends the run with an
        error naming the call that failed and why."""
        a = self.actors
        self.nodes.poll()
        self.failures[failed] = self.failures.get(failed, 0) + 1
        where = failed_call(exc)
        gone = self.nodes.lost()
        lost = f" ({gone})" if gone else ""
        if is_fatal(exc):
            raise RunError(f"step {failed} failed in {where}: {describe_cause(exc)}{lost}"
                           ) from None
        if self.failures[failed] > self.cfg.pipeline.max_step_retries:
            raise RunError(f"step {failed} failed {self.failures[failed]} times; last failure "
                           f"in {where}: {describe_cause(exc)}{lost} (raise "
                           "pipeline.max_step_retries to keep trying; `compassplay run --resume "
                           f"{self.run_dir}` continues from the last checkpoint)")
        log.warning("step %d failed in %s (%s); recovering (attempt %d of %d)", failed, where,
                    describe_cause(exc), self.failures[failed], self.cfg.pipeline.max_step_retries)
        if self.metrics is not None:
            self.metrics.steps_retried.inc()
        if a.learner.size > 1 and a.learner.any_dead():
            self._replace_learner_group()
        done = call_when_up(a.learner.steps_done, poll=self.stop.check)
        same_proposer = (call_when_up(a.proposer.incarnation, poll=self.stop.check)
                         == self.proposer_incarnation)
        if done == failed and same_proposer:
            self.evals.drop_from(failed)
            self._reset_weights(failed - 1)
            return failed
        log.warning("learner or proposer restarted: rolling back to the latest checkpoint")
        restored = call_when_up(a.learner.restore, self._newest_version() + 1,
                                poll=self.stop.check)
        start = self._start(restored)
        keep = [i for i, s in enumerate(self.recorded) if s.step < start]
        self.recorded = [self.recorded[i] for i in keep]
        self.recorded_at = [self.recorded_at[i] for i in keep]
        self.evals.drop_from(start)
        return start

    def _replace_learner_group(self) -> None:
        """A rank of the learner group died: a new group restores the latest checkpoint."""
        a = self.actors
        log.warning("a learner rank died: replacing the group of %d ranks", a.learner.size)
        a.learner.kill()
        a.learner = create_learner(self.cfg, str(self.run_dir), True, a.learner_pg)
        self.dispatch.by_role["learner"] = [a.learner]
        wait_ready(a.learner.named("learner"), requests(self.cfg),
                   self.cfg.cluster.startup_timeout_s, poll=self.stop.check)

    def _newest_version(self) -> int:
        """The newest weight version an actor may hold. Version refs are small, so they live
        in the driver's memory store and survive the learner's death."""
        best = max((s.weight_version for s in self.recorded), default=0)
        for snap in self.gate.snapshots():
            ref = snap["solver"][0]
            if ray.wait([ref], timeout=0)[0]:
                try:
                    best = max(best, int(ray.get(ref)))
                except RayError:
                    pass
        return best

    # ------------------------------------------------------------------------------- run
    def run(self, resume: bool = False) -> list[StepStats]:
        a = self.actors
        restored = ray.get(a.learner.restored_state.remote()) if resume else None
        step = self._start(restored)
        self.started_at = time.perf_counter()
        if restored is not None:
            log.info("resumed %s at step %d", self.run_dir, step)
        pending: deque[InFlight] = deque()
        while step < self.cfg.pipeline.steps or pending:
            if step < self.cfg.pipeline.steps and self.gate.may_submit(len(pending)):
                pending.append(self._submit(step))
                step += 1
                if self.metrics is not None:
                    self.metrics.queue_depth.labels("steps").set(len(pending))
                continue
            oldest = pending.popleft()
            try:
                while not ray.wait([oldest.result], timeout=1.0)[0]:
                    self.stop.check()  # Ctrl-C: drop the steps in flight (run_pipeline cleans up)
                    self.nodes.poll_due()  # a node that comes and goes within a step is seen
                    if self.on_stage is not None:
                        self.on_stage(oldest.step, oldest.running_stage())
                result = ray.get(oldest.result)
                self.traffic.record(oldest.step, oldest.handles, oldest.result)
            except RayError as exc:
                pending.clear()
                step = self._recover(oldest.step, exc)
                continue
            self._record(result)
        self.evals.finish(self._done())
        if self.verifiers is not None:
            self.verifiers.finish()
        if self.lean is not None:
            self.lean.finish()
        return self.recorded
