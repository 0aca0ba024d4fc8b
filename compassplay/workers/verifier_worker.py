"""The verifier worker: validates proposals and grades attempts on a sandbox pool (coding) or a
Lean REPL pool (lean; on the Ray executor by default the run's Lean fleet, passed in as
`backend`: see compassplay/actors/lean/fleet_actor.py)."""

from __future__ import annotations

from compassplay.config import RunConfig
from compassplay.step import stages
from compassplay.step.graph import StageCall
from compassplay.step.messages import (
    AttemptBatch,
    GradeBatch,
    Proposals,
    Validated,
    part_of,
)
from compassplay.step.timing import timed
from compassplay.workers.builders import make_env, make_verifier_backend, role_gpus


class VerifierWorker:
    """Validates proposals and grades attempts on an OS-isolated sandbox pool. Several
    verifiers split each call: worker `call.part` of `call.parts` takes one contiguous slice."""

    def __init__(self, cfg: RunConfig, backend=None) -> None:
        """`backend`: a started checker with LeanPool's interface to use instead of building
        one from the config (the Ray executor's FleetLeanPool)."""
        self.backend = backend if backend is not None else make_verifier_backend(cfg)
        self.env = make_env(cfg, self.backend)
        self.gpus = role_gpus(cfg, "verifier")

    def validate(self, call: StageCall, proposals: Proposals) -> Validated:
        """This verifier's slice of the proposals, checked for well-posedness."""
        with timed(self.gpus) as t:
            tasks = stages.validate(self.env, part_of(proposals.tasks, call.part, call.parts))
        return Validated(proposals.step, tasks, proposals.seed_tasks, t)

    def grade(self, call: StageCall, validated: Validated,
              attempts: AttemptBatch) -> GradeBatch:
        """Verdicts on this verifier's slice of the attempts."""
        with timed(self.gpus) as t:
            mine = part_of(attempts.attempts, call.part, call.parts)
            verdicts = stages.grade(self.env, validated.solved, mine)
        return GradeBatch(verdicts, t)

    def stats(self) -> dict:
        stats = self.backend.stats
        return stats() if callable(stats) else stats.snapshot()

    def close(self) -> None:
        self.backend.close()
