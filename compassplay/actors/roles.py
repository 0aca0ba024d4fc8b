"""Ray actors for the self-play roles: thin shells over `compassplay.roles`.

Each actor owns one role object. Weights travel as an ObjectRef wrapped in a list (so Ray does
not fetch them eagerly); an actor fetches them only when the offered version is newer than the
one it holds, which also brings a restarted actor up to date on its next call.
"""

from __future__ import annotations

import uuid

import ray

from compassplay.batches import (
    AttemptBatch,
    GradeBatch,
    Proposals,
    ScoredShard,
    StepResult,
    Validated,
)
from compassplay.config import RunConfig
from compassplay.records import Task
from compassplay.roles import LearnerRole, ProposerRole, SolverRole, VerifierRole
from compassplay.scorer_role import ScorerRole


def _sync(role, version: int, wref: list) -> None:
    if wref and version > role.weight_version:
        role.sync(ray.get(wref[0]), version)


class _Shell:
    """Common actor methods: weight version and a per-incarnation id (changes on restart)."""

    role: object

    def incarnation(self) -> str:
        if not hasattr(self, "_incarnation"):
            self._incarnation = uuid.uuid4().hex
        return self._incarnation

    def weight_version(self) -> int:
        return self.role.weight_version


@ray.remote
class ProposerActor(_Shell):
    def __init__(self, cfg: RunConfig) -> None:
        self.role = ProposerRole(cfg)
        self.incarnation()

    def propose(self, step: int, previous: Validated | None, snapshot: bool, version: int,
                wref: list) -> Proposals:
        _sync(self.role, version, wref)
        return self.role.propose(step, previous, snapshot)

    def load_buffer(self, state: dict | None, pending: list[Task]) -> None:
        self.role.load_buffer(state, pending)


@ray.remote
class SolverActor(_Shell):
    def __init__(self, cfg: RunConfig) -> None:
        self.role = SolverRole(cfg)
        self.incarnation()

    def solve(self, batch: Validated, version: int, wref: list) -> AttemptBatch:
        _sync(self.role, version, wref)
        return self.role.solve(batch)


@ray.remote
class VerifierActor(_Shell):
    def __init__(self, cfg: RunConfig) -> None:
        self.role = VerifierRole(cfg)
        self.incarnation()

    def validate(self, props: Proposals) -> Validated:
        return self.role.validate(props)

    def grade(self, batch: Validated, attempts: AttemptBatch) -> GradeBatch:
        return self.role.grade(batch, attempts)

    def stats(self) -> dict:
        return self.role.stats()

    def weight_version(self) -> int:
        return -1


@ray.remote
class ScorerActor(_Shell):
    def __init__(self, cfg: RunConfig, shard: int, num_shards: int) -> None:
        self.role = ScorerRole(cfg, shard, num_shards)
        self.incarnation()

    def score(self, batch: Validated, attempts: AttemptBatch, grades: GradeBatch, version: int,
              wref: list) -> ScoredShard:
        _sync(self.role, version, wref)
        return self.role.score(batch, attempts, grades)


@ray.remote
class LearnerActor(_Shell):
    def __init__(self, cfg: RunConfig, run_dir: str, restore: bool) -> None:
        self.role = LearnerRole(cfg, run_dir, restore=restore)
        self.incarnation()

    def learn(self, props: Proposals, batch: Validated, attempts: AttemptBatch,
              grades: GradeBatch, *shards: ScoredShard) -> StepResult:
        return self.role.learn(props, batch, attempts, grades, list(shards))

    def weights(self, role: str = "solver") -> dict:
        return self.role.weights(role)

    def steps_done(self) -> int:
        return self.role.steps_done

    def restored_state(self) -> dict | None:
        return self.role.restored_state

    def restore(self, min_version: int) -> dict | None:
        return self.role.restore(min_version)
