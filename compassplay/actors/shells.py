"""Ray actors for the self-play roles: thin shells over `compassplay.workers`.

Each actor owns one role object. Weights travel as an ObjectRef wrapped in a list (so Ray does
not fetch them eagerly); an actor fetches them only when the offered version is newer than the
one it holds, which also brings a restarted actor up to date on its next call.

With `learner.weight_sync=nccl` the driver passes an empty list instead and the weights arrive
by `receive(version)` calls paired with the learner's `broadcast` (see `pipeline.Pipeline`).
"""

from __future__ import annotations

import traceback
import uuid

import ray

from compassplay.config import RunConfig
from compassplay.records import Task
from compassplay.step.messages import (
    AttemptBatch,
    GradeBatch,
    Proposals,
    ScoredShard,
    StepResult,
    Validated,
)
from compassplay.workers.generators import ProposerWorker, SolverWorker
from compassplay.workers.learner import LearnerWorker
from compassplay.workers.scorer import ScorerWorker
from compassplay.workers.verifier import VerifierWorker


def _sync(role, version: int, wref: list) -> None:
    if wref and version > role.weight_version:
        role.sync(ray.get(wref[0]), version)
    elif version > role.weight_version:  # nccl mode: the broadcast did not arrive
        raise RuntimeError(f"step needs weight version {version} but this actor holds "
                           f"{role.weight_version} and got no weights (restarted receiver?)")


class _Shell:
    """Common actor methods: start-up report, weight version and a per-incarnation id.

    The role is built by `_build`, which keeps a constructor error instead of raising it: the
    driver asks `ready()` and reports one line naming the role and the cause, where a raising
    constructor would print Ray's traceback from every worker."""

    role: object

    def _build(self, make) -> None:
        try:
            self.role = make()
            self._start_error = ("", "")
        except Exception as exc:  # noqa: BLE001 - reported to the driver by ready()
            self.role = None
            text = " ".join(str(exc).split())[:500]  # one line for the driver's message
            self._start_error = (f"{type(exc).__name__}: {text}" if text else type(exc).__name__,
                                 traceback.format_exc())
        self.incarnation()

    def ready(self) -> tuple[str, str]:
        """('', '') once the role is built; else (the cause in one line, its traceback)."""
        return self._start_error

    def incarnation(self) -> str:
        if not hasattr(self, "_incarnation"):
            self._incarnation = uuid.uuid4().hex
        return self._incarnation

    def weight_version(self) -> int:
        return self.role.weight_version


class _Receiver(_Shell):
    """Generators and scorers: members of the learner's NCCL group (learner.weight_sync=nccl)."""

    def init_sync(self, addr: str, port: int, rank: int, world_size: int) -> None:
        self.role.init_sync(addr, port, rank, world_size)

    def receive(self, version: int) -> int:
        return self.role.receive(version)


@ray.remote
class ProposerActor(_Receiver):
    def __init__(self, cfg: RunConfig) -> None:
        self._build(lambda: ProposerWorker(cfg))

    def propose(self, step: int, previous: Validated | None, snapshot: bool, version: int,
                wref: list) -> Proposals:
        _sync(self.role, version, wref)
        return self.role.propose(step, previous, snapshot)

    def load_buffer(self, state: dict | None, pending: list[Task]) -> None:
        self.role.load_buffer(state, pending)


@ray.remote
class SolverActor(_Receiver):
    def __init__(self, cfg: RunConfig) -> None:
        self._build(lambda: SolverWorker(cfg))

    def solve(self, batch: Validated, version: int, wref: list) -> AttemptBatch:
        _sync(self.role, version, wref)
        return self.role.solve(batch)


@ray.remote
class VerifierActor(_Shell):
    def __init__(self, cfg: RunConfig) -> None:
        self._build(lambda: VerifierWorker(cfg))

    def validate(self, props: Proposals) -> Validated:
        return self.role.validate(props)

    def grade(self, batch: Validated, attempts: AttemptBatch) -> GradeBatch:
        return self.role.grade(batch, attempts)

    def stats(self) -> dict:
        return self.role.stats()

    def weight_version(self) -> int:
        return -1


@ray.remote
class ScorerActor(_Receiver):
    def __init__(self, cfg: RunConfig, shard: int, num_shards: int) -> None:
        self._build(lambda: ScorerWorker(cfg, shard, num_shards))

    def score(self, batch: Validated, attempts: AttemptBatch, grades: GradeBatch, version: int,
              wref: list) -> ScoredShard:
        _sync(self.role, version, wref)
        return self.role.score(batch, attempts, grades)


@ray.remote
class LearnerActor(_Shell):
    def __init__(self, cfg: RunConfig, run_dir: str, restore: bool) -> None:
        self._build(lambda: LearnerWorker(cfg, run_dir, restore=restore))

    def learn(self, props: Proposals, batch: Validated, attempts: AttemptBatch,
              grades: GradeBatch, *shards: ScoredShard) -> StepResult:
        return self.role.learn(props, batch, attempts, grades, list(shards))

    def weights(self, role: str = "solver") -> dict:
        return self.role.weights(role)

    def sync_address(self) -> tuple[str, int]:
        return self.role.sync_address()

    def init_sync(self, addr: str, port: int, world_size: int) -> None:
        self.role.init_sync(addr, port, world_size)

    def broadcast(self, version: int | None = None) -> int:
        return self.role.broadcast(version)

    def steps_done(self) -> int:
        return self.role.steps_done

    def restored_state(self) -> dict | None:
        return self.role.restored_state

    def restore(self, min_version: int) -> dict | None:
        return self.role.restore(min_version)
