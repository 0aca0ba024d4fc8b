"""The in-process executor: the roles of `roles.py` called in order, synchronously.

The reference path for debugging and for tests that compare against the Ray pipeline: each role
keeps its own copy of the weights and receives the learner's weights by version after every
update, exactly as the actors do, so equal seeds give equal metrics in both executors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from compassplay.config import RunConfig
from compassplay.records import StepStats
from compassplay.run.runlog import RunLog
from compassplay.workers.generators import ProposerWorker, SolverWorker
from compassplay.workers.learner import (
    LearnerWorker,
    is_checkpoint_step,
    restored_buffer,
    restored_metrics,
)
from compassplay.workers.scorer import ScorerWorker
from compassplay.workers.verifier import VerifierWorker

log = logging.getLogger(__name__)


class LocalExecutor:
    """Owns every role in one process; `run()` executes steps start_step..pipeline.steps-1."""

    def __init__(self, cfg: RunConfig, run_dir: Path, resume: bool = False) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.learner = LearnerWorker(cfg, str(run_dir), restore=resume)
        self.proposer = ProposerWorker(cfg)
        self.solver = SolverWorker(cfg)
        self.verifier = VerifierWorker(cfg)
        n = cfg.scorer.num_scorers
        self.scorers = [ScorerWorker(cfg, i, n) for i in range(n)]
        self.runlog = RunLog(self.run_dir, cfg, resume=resume)
        self.start_step = self.learner.steps_done
        state = self.learner.restored_state
        if state is not None:
            self.proposer.load_buffer(*restored_buffer(state))
            self.runlog.rewind(*restored_metrics(state))
            log.info("resumed %s at step %d", self.run_dir, self.start_step)
        elif resume:
            self.runlog.rewind(0, [])
        self.sync()

    def sync(self) -> None:
        """Push the learner's current weights (by version) to every generator and scorer."""
        v = self.learner.weight_version
        solver_w = self.learner.weights("solver")
        shared = self.cfg.learner.shared_model
        proposer_w = solver_w if shared else self.learner.weights("proposer")
        self.proposer.sync(proposer_w, v)
        self.solver.sync(solver_w, v)
        for s in self.scorers:
            s.sync(solver_w, v)

    def run(self, progress: Callable[[StepStats], None] | None = None) -> list[StepStats]:
        out, previous = [], None
        try:
            for step in range(self.start_step, self.cfg.pipeline.steps):
                props = self.proposer.propose(step, previous,
                                              snapshot=is_checkpoint_step(self.cfg, step))
                batch = self.verifier.validate(props)
                attempts = self.solver.solve(batch)
                grades = self.verifier.grade(batch, attempts)
                shards = [s.score(batch, attempts, grades) for s in self.scorers]
                result = self.learner.learn(props, batch, attempts, grades, shards)
                self.sync()
                self.runlog.write(result.stats)
                self.runlog.write_samples(result.extra.get("samples", []))
                out.append(result.stats)
                log.info("step %d: %s", step, brief(result.stats))
                if progress is not None:
                    progress(result.stats)
                previous = batch
        finally:
            self.verifier.close()
            self.runlog.close()
        return out


def brief(s: StepStats) -> str:
    """One log line for a step."""
    return (f"proposals={s.proposals} valid={s.valid} eligible={s.eligible} "
            f"solve={s.solve_rate_mean:.2f} reward={s.reward_mean:.4f} loss={s.loss:.4f} "
            f"v={s.weight_version} ({s.step_seconds:.1f}s)")
