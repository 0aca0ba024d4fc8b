"""The in-process executor: the step graph run on worker objects in one process.

The reference path for debugging and for tests that compare against the Ray executor: the
same `step.graph.submit_step`, with a `Dispatch` that calls workers directly. Each worker
keeps its own copy of the weights and is offered the learner's snapshots through the same
`VersionGate`, so equal seeds give equal metrics in both executors, staleness included (a
rollout uses the weights after learn(k - staleness - 1); here nothing overlaps in time).

With `eval.every_steps` > 0 the weights after every k-th step are evaluated in process right
after that step, which blocks training meanwhile (the Ray executor evaluates on an actor of
its own and does not wait); the results are "eval" lines of metrics.jsonl.

With `logging.prometheus_port` set, the run's Prometheus metrics (`executors.metrics`, the same
series as the Ray driver serves, verifier and Lean fleet gauges aside) are served while it
runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compassplay.config import RunConfig
from compassplay.executors.metrics import RunMetrics
from compassplay.records import StepStats
from compassplay.rundir.runlog import RunLog
from compassplay.step.graph import Role, StageCall, WeightsOffer, run_stage, submit_step
from compassplay.sync.version_gate import VersionGate
from compassplay.workers.eval_worker import EvalReport, EvalWorker, eval_due
from compassplay.workers.generator_workers import ProposerWorker, SolverWorker
from compassplay.workers.learner_worker import (
    LearnerWorker,
    is_checkpoint_step,
    restored_env_state,
    restored_metrics,
)
from compassplay.workers.scorer_worker import ScorerWorker
from compassplay.workers.verifier_worker import VerifierWorker

log = logging.getLogger(__name__)


class InProcess:
    """A Dispatch that runs each stage at once on the worker object (handles are values)."""

    def __init__(self, workers: dict[Role, list[Any]]) -> None:
        self.workers = workers

    def count(self, role: Role) -> int:
        return len(self.workers[role])

    def call(self, role: Role, index: int, call: StageCall, args: list[Any]) -> Any:
        return run_stage(self.workers[role][index], call, args)


class LocalExecutor:
    """Owns every worker in one process; `run()` executes steps start_step..pipeline.steps-1."""

    def __init__(self, cfg: RunConfig, run_dir: Path, resume: bool = False) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.learner = LearnerWorker(cfg, str(run_dir), restore=resume)
        self.proposer = ProposerWorker(cfg)
        self.verifiers = [VerifierWorker(cfg) for _ in range(cfg.cluster.num_verifiers)]
        n = cfg.scorer.num_scorers
        self.scorers = [ScorerWorker(cfg, i, n) for i in range(n)]
        self.solver = SolverWorker(cfg)
        self.evaluator = EvalWorker(cfg) if cfg.eval.every_steps else None
        self.dispatch = InProcess({"proposer": [self.proposer], "solver": [self.solver],
                                   "verifier": self.verifiers, "scorer": self.scorers,
                                   "learner": [self.learner]})
        self.runlog = RunLog(self.run_dir, cfg, resume=resume)
        self.metrics = RunMetrics.for_run(cfg)
        self.start_step = self.learner.steps_done
        state = self.learner.restored_state
        self.proposer.load_env_state(restored_env_state(state) if state else None)
        if state is not None:
            self.runlog.rewind(*restored_metrics(state))
            log.info("resumed %s at step %d", self.run_dir, self.start_step)
        elif resume:
            self.runlog.rewind(0, [])
        self.gate: VersionGate[dict] = VersionGate(cfg.pipeline.staleness)
        self.gate.reset(self.start_step - 1, self.snapshot())

    def snapshot(self) -> dict[str, tuple[int, list]]:
        """The learner's current weights per generator role, as the gate hands them out:
        each a packed copy (`sync.packed`) that later learning leaves as it is."""
        out = {}
        for role in ("solver", "proposer"):
            if role == "proposer" and self.cfg.learner.shared_model:
                out[role] = out["solver"]
                continue
            version, state = self.learner.snapshot(role)
            out[role] = (version, [state])
        if self.cfg.reward.needs.metric:  # the weights plus the optimizer metric (precond_cosine)
            version, state = self.learner.snapshot("scorer")
            out["scorer"] = (version, [state])
        return out

    def run(self, progress: Callable[[StepStats], None] | None = None) -> list[StepStats]:
        out = []
        try:
            if self.cfg.logging.prometheus_port:
                self.metrics.serve(self.cfg.logging.prometheus_port,
                                   self.cfg.logging.prometheus_host)
            last = time.perf_counter()  # the previous result's time (`wall_seconds`)
            for step in range(self.start_step, self.cfg.pipeline.steps):
                handles = submit_step(step, self.dispatch, self.gate.for_rollout(step),
                                      is_checkpoint_step(self.cfg, step),
                                      self.cfg.task.domain)
                snap = self.snapshot()
                self.gate.report(step, snap)
                result = handles["learn"]
                now = time.perf_counter()
                stats = result.stats.model_copy(update={"wall_seconds": now - last})
                last = now
                self.runlog.write(stats)
                self.metrics.observe_step(stats)
                self.runlog.write_samples(result.extra.get("samples", []))
                if self.evaluator is not None and eval_due(self.cfg, step):
                    version, box = snap["solver"]
                    self.write_eval(self.evaluator.evaluate(
                        step, WeightsOffer(version, lambda b=box: b[0])))
                out.append(stats)
                log.info("step %d: %s", step, brief(stats))
                if progress is not None:
                    progress(stats)
        finally:
            for v in self.verifiers:
                v.close()
            if self.evaluator is not None:
                self.evaluator.close()
            self.metrics.close()
            self.runlog.close()
        return out

    def write_eval(self, report: EvalReport) -> None:
        for m in report.metrics:
            self.runlog.write_line(m)
        log.info("eval after step %d (v%d, %.1fs): %s", report.step, report.version,
                 report.timing.seconds, eval_brief(report))


def eval_brief(report: EvalReport) -> str:
    """One log line's worth of an evaluation's accuracies."""
    return " ".join(f"{m.benchmark}={m.accuracy:.3f}" for m in report.metrics) or "nothing ran"


def brief(s: StepStats) -> str:
    """One log line for a step."""
    return (f"proposals={s.proposals} valid={s.valid} eligible={s.eligible} "
            f"solve={s.solve_rate_mean:.2f} reward={s.reward_mean:.4f} loss={s.loss:.4f} "
            f"v={s.weight_version} ({s.step_seconds:.1f}s)")
