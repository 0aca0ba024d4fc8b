"""The verifier worker: validates proposals and grades attempts on a sandbox pool."""

from __future__ import annotations

import time

import torch

from compassplay.config import RunConfig
from compassplay.step import stages
from compassplay.step.messages import (
    AttemptBatch,
    GradeBatch,
    Proposals,
    Validated,
)
from compassplay.workers.builders import (
    make_env,
    make_sandbox,
)

Weights = dict[str, torch.Tensor]



class VerifierWorker:
    """Validates proposals and grades attempts on an OS-isolated sandbox pool."""

    def __init__(self, cfg: RunConfig) -> None:
        self.sandbox = make_sandbox(cfg.verifiers)
        self.env = make_env(cfg, self.sandbox)

    def validate(self, props: Proposals) -> Validated:
        t0 = time.perf_counter()
        tasks = stages.validate(self.env, props.tasks)
        solved = [t for t in tasks if t.valid] + props.seed_tasks
        return Validated(props.step, tasks, solved, time.perf_counter() - t0)

    def grade(self, batch: Validated, attempts: AttemptBatch) -> GradeBatch:
        t0 = time.perf_counter()
        verdicts = stages.grade(self.env, batch.solved, attempts.attempts)
        return GradeBatch(verdicts, time.perf_counter() - t0)

    def stats(self) -> dict:
        return self.sandbox.stats.snapshot()

    def close(self) -> None:
        self.sandbox.close()
