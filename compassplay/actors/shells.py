"""Ray actors for the self-play roles: thin shells over `compassplay.workers`.

Each actor owns one worker object and runs the step's stages on it with one generic method,
`run_stage(call, *args)` (see `step.graph`): Ray resolves the ObjectRefs among `args` before
the call, except a weights offer's state, which stays a reference in a list until the worker
finds its version newer than the one it holds (`ray.get` then fetches it). That also brings a
restarted actor up to date on its next call.

With `learner.weight_sync=nccl` the state does not travel with the call: it arrives by
`receive(version)` calls paired with the learner's `broadcast` (see `executors.ray.driver`).
"""

from __future__ import annotations

import traceback
import uuid
from typing import Any

import ray

from compassplay.actors.lean.fleet_actor import FleetLeanPool
from compassplay.actors.whereabouts import here
from compassplay.config import RunConfig
from compassplay.engines.training.dist import RankInfo, rendezvous
from compassplay.step.graph import StageCall, WeightsOffer, run_stage
from compassplay.sync.packed import PackArena
from compassplay.workers.eval_worker import EvalReport, EvalWorker
from compassplay.workers.generator_workers import ProposerWorker, SolverWorker
from compassplay.workers.learner_worker import LearnerWorker
from compassplay.workers.scorer_worker import ScorerWorker
from compassplay.workers.verifier_worker import VerifierWorker


class _Shell:
    """Common actor methods: start-up report, stage calls, weight version, incarnation id.

    The worker is built by `_build`, which keeps a constructor error instead of raising it:
    the driver asks `ready()` and reports one line naming the role and the cause, where a
    raising constructor would print Ray's traceback from every worker."""

    role: Any

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
        """('', '') once the worker is built; else (the cause in one line, its traceback)."""
        return self._start_error

    def run_stage(self, call: StageCall, *args: Any) -> Any:
        """Run one stage of the step graph on this actor's worker."""
        return run_stage(self.role, call, args, fetch=ray.get)

    def where(self) -> dict[str, Any]:
        """This actor's node, node type and assigned resources (`whereabouts.here`)."""
        return here()

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

    def receive(self, version: int | None = None) -> int:
        return self.role.receive(version)

    def receive_ipc(self, update: tuple[int, str]) -> int:
        return self.role.receive_ipc(update)


@ray.remote
class ProposerActor(_Receiver):
    def __init__(self, cfg: RunConfig) -> None:
        self._build(lambda: ProposerWorker(cfg))

    def load_env_state(self, state: dict | None) -> None:
        self.role.load_env_state(state)


@ray.remote
class SolverActor(_Receiver):
    def __init__(self, cfg: RunConfig) -> None:
        self._build(lambda: SolverWorker(cfg))


@ray.remote
class VerifierActor(_Shell):
    def __init__(self, cfg: RunConfig, lean_fleet: Any = None) -> None:
        """`lean_fleet`: the run's LeanFleetActor (task.domain=lean, verifiers.lean.backend=
        fleet); Lean checks then go to its LeanVerifier actors instead of a pool of our own."""
        def make() -> VerifierWorker:
            if lean_fleet is None:
                return VerifierWorker(cfg)
            return VerifierWorker(cfg, backend=FleetLeanPool(lean_fleet, cfg.verifiers.lean))
        self._build(make)

    def stats(self) -> dict:
        return self.role.stats()

    def weight_version(self) -> int:
        return -1


@ray.remote
class ScorerActor(_Receiver):
    def __init__(self, cfg: RunConfig, shard: int, num_shards: int) -> None:
        self._build(lambda: ScorerWorker(cfg, shard, num_shards))


@ray.remote
class LearnerActor(_Shell):
    """One rank of the learner group (`actors.learner_group`). With one rank the worker is
    built in the constructor; with more it is built by `start(addr, port)` (rank 0's
    `rendezvous()`), which every rank runs together (the process group forms collectively)."""

    def __init__(self, cfg: RunConfig, run_dir: str, restore: bool, rank: int = 0,
                 world_size: int = 1) -> None:
        self._args = (cfg, run_dir, restore, rank, world_size)
        self._arena = PackArena()  # the snapshots' buffer (`snapshot`)
        self._start_error = ("not started: start(addr, port) was not called", "")
        if world_size == 1:
            self._build(lambda: self._reserved(LearnerWorker(cfg, run_dir, restore=restore)))

    def _reserved(self, worker: LearnerWorker) -> LearnerWorker:
        """`worker`, with its snapshots' buffer reserved (`reserve_snapshots`) and one object
        of that size put into the node's object store and dropped, so that the store's shared
        memory is faulted in too (the first snapshot's store took 0.6 s, a later one 0.1 s).
        One rank only: a group's weights are gathered collectively, and its first snapshot
        pays."""
        if nbytes := worker.reserve_snapshots(self._arena):
            warm = ray.put(self._arena.take(nbytes))
            del warm
        return worker

    def rendezvous(self) -> tuple[str, int]:
        """(this node's IP, a free port): rank 0's address for the group."""
        return rendezvous()

    def start(self, addr: str, port: int) -> None:
        cfg, run_dir, restore, rank, world = self._args
        info = RankInfo(rank, world, addr, int(port))
        self._build(lambda: LearnerWorker(cfg, run_dir, restore=restore, dist=info))

    def snapshot(self, role: str = "solver") -> tuple[int, Any]:
        """(version, packed weights) as two returns: call with .options(num_returns=2). The
        pack reuses one buffer: Ray copies this call's returns into the object store before
        the actor's next call runs."""
        return self.role.snapshot(role, self._arena)

    def sync_address(self) -> tuple[str, int]:
        return self.role.sync_address()

    def init_sync(self, addr: str, port: int, world_size: int) -> None:
        self.role.init_sync(addr, port, world_size)

    def broadcast(self, version: int | None = None) -> int:
        return self.role.broadcast(version)

    def publish_ipc(self) -> tuple[int, str]:
        return self.role.publish_ipc()

    def release_ipc(self, *loaded: int) -> None:
        self.role.release_ipc(*loaded)

    def steps_done(self) -> int:
        return self.role.steps_done

    def restored_state(self) -> dict | None:
        return self.role.restored_state

    def restore(self, min_version: int) -> dict | None:
        return self.role.restore(min_version)


@ray.remote
class EvalActor(_Shell):
    """Evaluation during training (eval.every_steps > 0) on its own copy of the weights."""

    def __init__(self, cfg: RunConfig) -> None:
        self._build(lambda: EvalWorker(cfg))

    def evaluate(self, step: int, version: int, box: list) -> EvalReport:
        """Evaluate the weights of `version` (Ray resolves it) after `step`; the state stays a
        reference in `box` until the worker finds the version newer than the one it holds."""
        return self.role.evaluate(step, WeightsOffer(int(version),
                                                     lambda: ray.get(box[0]) if box else None))
