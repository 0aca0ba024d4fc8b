"""The roles of a self-play run as plain objects: each owns one engine/pool and calls stages.

ProposerRole, SolverRole, VerifierRole, ScorerRole and LearnerRole are what the Ray actors
wrap (`actors/`) and what the local executor calls in-process, so both run the same code.
Each method returns a small batch record carrying the seconds it took.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from compassplay import stages
from compassplay.batches import (
    AttemptBatch,
    GradeBatch,
    Proposals,
    ScoredShard,
    StepResult,
    Validated,
    merge_shards,
    merge_utility,
)
from compassplay.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from compassplay.components import (
    configure_torch,
    make_env,
    make_generator,
    make_sandbox,
)
from compassplay.config import RunConfig, SamplingSection
from compassplay.engines.factory import make_learner
from compassplay.engines.vllm_generation import VLLMGenerationEngine
from compassplay.models import load_model
from compassplay.records import StepStats, Task
from compassplay.weight_channel import NcclChannel, free_port, node_address, open_channel

Weights = dict[str, torch.Tensor]


class Versioned:
    """Holds a weight version; `sync` loads newer weights into every engine it owns.

    With `learner.weight_sync=nccl` the role joins the learner's group once (`init_sync`) and
    then takes each broadcast with `receive(version)`, which loads through `sync`."""

    weight_version: int = 0
    cfg: RunConfig
    channel: NcclChannel | None = None

    def sync(self, weights: Weights | None, version: int) -> None:
        """Load `weights` when `version` is newer than what this role holds."""
        if weights is not None and version > self.weight_version:
            self.load_weights(weights, version)
            self.weight_version = version

    def load_weights(self, weights: Weights, version: int) -> None:  # pragma: no cover
        raise TypeError(f"{type(self).__name__} holds no weights")

    def init_sync(self, addr: str, port: int, rank: int, world_size: int) -> None:
        """Join the learner's weight-sync group as `rank` (collective with all members)."""
        self.channel = open_channel(self.cfg, addr, port, rank, world_size,
                                    version=self.weight_version)

    def receive(self, version: int) -> int:
        """Take the broadcast the learner is sending now as `version`; returns the version held."""
        if self.channel is None:
            raise RuntimeError("receive() before init_sync(): this role is not in the "
                               "learner's weight-sync group (restarted actor?)")
        self.sync(self.channel.receive(version), version)
        return self.weight_version


class _GeneratorRole(Versioned):
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


class ProposerRole(_GeneratorRole):
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


class SolverRole(_GeneratorRole):
    """Samples n attempts per task with its own copy of the weights."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg, cfg.solver)

    def solve(self, batch: Validated) -> AttemptBatch:
        t0 = time.perf_counter()
        attempts = stages.solve(self.env, self.engine, self.tok, self.cfg, batch.solved,
                                batch.step)
        return AttemptBatch(attempts, time.perf_counter() - t0)


class VerifierRole:
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


def is_checkpoint_step(cfg: RunConfig, step: int) -> bool:
    return (step + 1) % cfg.learner.checkpoint_every == 0 or step + 1 == cfg.pipeline.steps


class LearnerRole:
    """Assigns rewards, updates the policy, checkpoints; the source of weight versions.

    Checkpoint `k` is written inside `learn(k)` (atomically, every `checkpoint_every` steps and
    at the last step) and holds: learner state, the task buffer as the proposer snapshotted it
    for step k plus step k's valid tasks, and the StepStats since the previous checkpoint (so a
    driver killed before writing its metrics lines loses none). A restarted learner actor
    restores the latest checkpoint in its constructor.
    """

    channel: NcclChannel | None = None  # learner.weight_sync=nccl, after init_sync

    def __init__(self, cfg: RunConfig, run_dir: str, restore: bool = False) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        configure_torch(cfg)
        self.model, self.tok = load_model(cfg.model, seed=cfg.run.seed)
        self._initial = {k: v.clone() for k, v in self.model.state_dict().items()}
        self.learner = make_learner(cfg.learner, self.model, total_steps=cfg.pipeline.steps)
        self.env = make_env(cfg, None)
        self.steps_done = 0
        self.version_offset = 0
        self.recent: list[StepStats] = []
        self.restored_state: dict | None = None
        if restore:
            self.restore()

    @property
    def weight_version(self) -> int:
        return self.learner.weight_version + self.version_offset

    def weights(self, role: str = "solver") -> Weights:
        return self.learner.state_dict_for_sync(role)

    # learner.weight_sync=nccl: the learner is rank 0 of the weight-sync group
    def sync_address(self) -> tuple[str, int]:
        """(this node's IP, a free port) for the group's store."""
        return node_address(), free_port()

    def init_sync(self, addr: str, port: int, world_size: int) -> None:
        self.channel = open_channel(self.cfg, addr, port, 0, world_size)

    def broadcast(self, version: int | None = None) -> int:
        """Send the current (shared-model) weights as `version` (default: weight_version)."""
        if self.channel is None:
            raise RuntimeError("broadcast() before init_sync()")
        version = self.weight_version if version is None else version
        self.channel.send(self.weights("solver"), version)
        return version

    def restore(self, min_version: int = 0) -> dict | None:
        """Reload the latest checkpoint (or the initial weights when there is none); weight
        versions stay >= `min_version` so engines holding newer versions accept the rollback."""
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            self.model.load_state_dict(self._initial)
            self.learner = make_learner(self.cfg.learner, self.model,
                                        total_steps=self.cfg.pipeline.steps)
            self.steps_done, self.restored_state = 0, None
        else:
            self.restored_state = load_checkpoint(ckpt, self.learner)
            self.steps_done = self.restored_state["step"] + 1
        self.version_offset = max(0, min_version - self.learner.weight_version)
        self.recent = []
        return self.restored_state

    def learn(self, props: Proposals, batch: Validated, attempts: AttemptBatch,
              grades: GradeBatch, shards: list[ScoredShard]) -> StepResult:
        """Rewards -> trajectories -> one policy update -> the step's metrics (+ checkpoint)."""
        if props.step != self.steps_done:
            raise RuntimeError(f"learner expected step {self.steps_done}, got {props.step}")
        param_shard = self.cfg.scorer.shard_mode == "param_shard"
        cands, alignment = merge_shards(shards, param_shard) if shards else ([], {})
        scores = stages.assign_rewards(self.cfg.reward, batch.tasks, grades.verdicts, cands,
                                       alignment, merge_utility(shards))
        trajs = stages.make_trajectories(self.env, batch.tasks + props.seed_tasks,
                                         attempts.attempts, grades.verdicts, scores)
        t0 = time.perf_counter()
        lstats = self.learner.step(trajs)
        lstats.weight_version = self.weight_version
        seconds = {"propose": props.seconds, "validate": batch.seconds,
                   "solve": attempts.seconds, "grade": grades.seconds,
                   "score": max((s.seconds for s in shards), default=0.0),
                   "learn": time.perf_counter() - t0}
        stats = stages.summarize(props.step, batch.tasks, batch.solved, attempts.attempts,
                                 grades.verdicts, scores, lstats, seconds)
        self.steps_done += 1
        self.recent.append(stats)
        ckpt = ""
        if is_checkpoint_step(self.cfg, props.step):
            ckpt = self._checkpoint(props, batch)
        return StepResult(stats, self.weight_version,
                          {"checkpoint": ckpt, "samples": stages.samples(props.step, batch.tasks,
                                                                         scores)})

    def _checkpoint(self, props: Proposals, batch: Validated) -> str:
        if props.buffer_state is None:
            raise RuntimeError(f"step {props.step} is a checkpoint step but its proposals "
                               "carry no buffer snapshot")
        state = {"step": props.step, "buffer": props.buffer_state,
                 "buffer_pending": [t.model_dump(mode="json") for t in batch.tasks if t.valid],
                 "recent_stats": [s.model_dump(mode="json") for s in self.recent]}
        path = save_checkpoint(self.run_dir, props.step, self.learner, state,
                               keep_last=self.cfg.learner.keep_last)
        self.recent = []
        return str(path)


def restored_buffer(state: dict) -> tuple[dict, list[Task]]:
    """The checkpointed buffer state and the checkpoint step's valid tasks still to add."""
    return state["buffer"], [Task.model_validate(t) for t in state["buffer_pending"]]


def restored_metrics(state: dict) -> tuple[int, list[StepStats]]:
    """(lines of metrics.jsonl to keep, StepStats to append) after restoring `state`."""
    recent = [StepStats.model_validate(s) for s in state["recent_stats"]]
    return state["step"] + 1 - len(recent), recent
