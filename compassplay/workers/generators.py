"""The proposer and solver workers: each samples with its own generation engine."""

from __future__ import annotations

import time

from compassplay.config import RunConfig, SamplingSection
from compassplay.engines.vllm_generation import VLLMGenerationEngine
from compassplay.models import load_model
from compassplay.records import Task
from compassplay.step import stages
from compassplay.step.messages import (
    AttemptBatch,
    Proposals,
    Validated,
)
from compassplay.workers.builders import (
    configure_torch,
    make_env,
    make_generator,
)
from compassplay.workers.versioned import Versioned, Weights


class _GeneratorWorker(Versioned):
    """A role that samples with its own generation engine (sampling settings: `section`)."""

    def __init__(self, cfg: RunConfig, section: SamplingSection) -> None:
        self.cfg = cfg
        configure_torch(cfg)
        model, self.tok = load_model(cfg.model, seed=cfg.run.seed)
        self.engine = make_generator(cfg, section, model, self.tok)
        self.env = make_env(cfg, None)

    def load_weights(self, weights: Weights, version: int) -> None:
        self.engine.load_weights(weights, version)

    def init_sync(self, addr: str, port: int, rank: int, world_size: int) -> None:
        if isinstance(self.engine, VLLMGenerationEngine):  # its worker joins (tp size 1)
            self.engine.init_weight_broadcast(addr, port, rank, world_size)
        else:
            super().init_sync(addr, port, rank, world_size)

    def receive(self, version: int) -> int:
        if not isinstance(self.engine, VLLMGenerationEngine):
            return super().receive(version)
        # vLLM receives in its workers, loads in place and refuses older versions itself
        self.engine.receive_weights_broadcast(version, src=0,
                                              bucket_bytes=self.cfg.learner.sync_bucket_mb << 20)
        self.weight_version = version
        return version


class ProposerWorker(_GeneratorWorker):
    """Writes proposals with its own copy of the weights; owns the task buffer."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg, cfg.proposer)

    def propose(self, step: int, previous: Validated | None, snapshot: bool = False) -> Proposals:
        """Add the previous step's valid tasks to the buffer, then propose this step's tasks."""
        t0 = time.perf_counter()
        if previous is not None:
            self.env.buffer.add([t for t in previous.tasks if t.valid])
        state = self.env.buffer.state_dict() if snapshot else None
        out = stages.propose(self.env, self.engine, self.tok, self.cfg, step)
        return Proposals(step, out.tasks, out.seed_tasks, time.perf_counter() - t0, state)

    def load_buffer(self, state: dict | None, pending: list[Task]) -> None:
        """Replace the buffer (None = the fresh seed buffer) and add `pending` tasks."""
        if state is None:
            self.env = make_env(self.cfg, None)
        else:
            self.env.buffer.load_state_dict(state)
        self.env.buffer.add(pending)


class SolverWorker(_GeneratorWorker):
    """Samples n attempts per task with its own copy of the weights."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg, cfg.solver)

    def solve(self, batch: Validated) -> AttemptBatch:
        t0 = time.perf_counter()
        attempts = stages.solve(self.env, self.engine, self.tok, self.cfg, batch.solved,
                                batch.step)
        return AttemptBatch(attempts, time.perf_counter() - t0)
