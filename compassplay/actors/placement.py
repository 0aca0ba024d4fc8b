"""Create the actors of a run with the resources and placement the config asks for."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from compassplay.actors.lean.fleet_actor import LeanFleetActor
from compassplay.actors.learner_group import LearnerGroup
from compassplay.actors.shells import (
    EvalActor,
    LearnerActor,
    ProposerActor,
    ScorerActor,
    SolverActor,
    VerifierActor,
)
from compassplay.config import ActorResources, RunConfig
from compassplay.errors import ActorStartError
from compassplay.plan.resources import bundle, bundle_plan, uses_lean_fleet
from compassplay.sync.gpu_members import ipc_roles

log = logging.getLogger(__name__)

# Verifier and scorer calls are idempotent: Ray restarts the actor and retries them.
RETRY_FOREVER = {"max_restarts": -1, "max_task_retries": -1}
# Generators and the learner restart, but their in-flight calls fail (the driver recovers).
RESTART_ONLY = {"max_restarts": -1, "max_task_retries": 0}


@dataclass
class ActorSet:
    proposer: Any
    solver: Any
    verifiers: list[Any]
    scorers: list[Any]
    learner: LearnerGroup
    placement_groups: list[Any] = field(default_factory=list)
    evaluator: Any = None  # only with eval.every_steps > 0
    learner_pg: Any = None  # the placement group the learner ranks run in (None: none)
    lean_fleet: Any = None  # only with task.domain=lean and verifiers.lean.backend=fleet

    def __post_init__(self) -> None:
        if not isinstance(self.learner, LearnerGroup):  # one actor handle: a group of one
            self.learner = LearnerGroup([self.learner])

    def all(self) -> list[Any]:
        extra = [a for a in (self.evaluator, self.lean_fleet) if a is not None]
        return [self.proposer, self.solver, *self.verifiers, *self.scorers,
                *self.learner.ranks, *extra]

    def named(self) -> dict[str, Any]:
        """Role name (as in the config's cluster section, with an index) -> actor handle;
        a learner group's ranks are learner-0, learner-1, ..."""
        out = {**self.learner.named("learner"), "proposer": self.proposer,
               "solver": self.solver}
        out.update({f"verifier-{i}": a for i, a in enumerate(self.verifiers)})
        out.update({f"scorer-{i}": a for i, a in enumerate(self.scorers)})
        if self.evaluator is not None:
            out["eval"] = self.evaluator
        if self.lean_fleet is not None:
            out["lean-fleet"] = self.lean_fleet
        return out

    def shutdown(self) -> None:
        if self.lean_fleet is not None:  # stop its LeanVerifiers' REPL process groups first
            try:
                ray.get(self.lean_fleet.close.remote(), timeout=60)
            except Exception as exc:  # noqa: BLE001 -- killed below either way
                log.warning("closing the Lean fleet failed (%s); killing it", exc)
        for a in self.all():
            ray.kill(a, no_restart=True)
        for pg in self.placement_groups:
            remove_placement_group(pg)


def actor_options(res: ActorResources, name: str, policy: dict, pg=None,
                  bundle: int | None = None) -> dict[str, Any]:
    """Ray options for one actor: a dashboard name, resources, restart policy, placement."""
    opts: dict[str, Any] = {"name": name, "num_cpus": res.num_cpus, "num_gpus": res.num_gpus,
                            **policy}
    if res.resources:
        opts["resources"] = dict(res.resources)
    if pg is not None:
        opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=bundle)
    return opts


def make_lean_fleet(cfg: RunConfig) -> Any:
    """The run's LeanFleetActor (no CPU of its own; its LeanVerifiers ask verifiers.lean.actor),
    after a log line on what the cluster offers of the resources they ask for."""
    lc = cfg.verifiers.lean
    total = ray.cluster_resources()
    have = {k: total.get(k, 0.0) for k in lc.actor.resources}
    log.info("Lean checks go to LeanVerifier actors (%s..%s, each asks %s CPU + %s); the "
             "cluster has %s", lc.scaling.min_actors, lc.scaling.max_actors, lc.actor.num_cpus,
             lc.actor.resources, have)
    missing = [k for k, v in have.items() if not v]
    if missing:
        log.warning("no node advertises %s: LeanVerifier actors stay pending until an autoscaler "
                    "adds one; %s", missing,
                    f"the run gives up after {lc.resource_wait_s:.0f} s "
                    f"(verifiers.lean.resource_wait_s, on_no_resource={lc.on_no_resource})"
                    if lc.resource_wait_s else "verifiers.lean.resource_wait_s=0: waiting forever")
    return LeanFleetActor.options(name=f"{cfg.run.name}:lean-fleet", num_cpus=0,
                                  **RETRY_FOREVER).remote(lc)


def wait_placement_group(pg, timeout_s: float, log_every_s: float = 10.0) -> None:
    """`pg.ready()` with a log line while it waits and ActorStartError after `timeout_s`."""
    start = time.monotonic()
    while True:
        ready, _ = ray.wait([pg.ready()], timeout=log_every_s)
        if ready:
            return
        waited = time.monotonic() - start
        log.info("waiting %.0f s for placement group %s (bundles %s); cluster has free %s",
                 waited, pg.id.hex()[:8], pg.bundle_specs, ray.available_resources())
        if timeout_s and waited > timeout_s:
            raise ActorStartError("learner+scorers", f"placement group {pg.bundle_specs} not "
                                  f"placed after {timeout_s:.0f} s; raise "
                                  "cluster.startup_timeout_s or add resources")


def create_learner(cfg: RunConfig, run_dir: str, restore: bool, pg=None,
                   suffix: str = "") -> LearnerGroup:
    """`learner.num_ranks` LearnerActors as one group, each with `cluster.learner`'s
    resources: in bundles 0..N-1 of `pg`, else (N > 1) in a PACK placement group of their
    own (appended to `pgs`); one rank restarts by itself, a group's ranks do not."""
    c, run, world = cfg.cluster, cfg.run.name, cfg.learner.num_ranks
    policy = RESTART_ONLY if world == 1 else {"max_restarts": 0, "max_task_retries": 0}
    ranks = []
    for r in range(world):
        name = f"{run}:learner{suffix}" + (f"-{r}" if world > 1 else "")
        ranks.append(LearnerActor.options(**actor_options(
            c.learner, name, policy, pg, None if pg is None else r)).remote(
                cfg, run_dir, restore, r, world))
    if world > 1:
        addr_port = ranks[0].rendezvous.options(num_returns=2).remote()
        for a in ranks:  # runs after placement; the driver's wait_ready() waits for it
            a.start.remote(*addr_port)
    return LearnerGroup(ranks)


def learner_placement(cfg: RunConfig, suffix: str = ""):
    """The placement group of a learner group of N > 1 ranks alone (None for one rank)."""
    c, world = cfg.cluster, cfg.learner.num_ranks
    if world == 1:
        return None
    pg = placement_group([bundle(c.learner)] * world, strategy="PACK",
                         name=f"{cfg.run.name}:learner{suffix}")
    wait_placement_group(pg, c.startup_timeout_s)
    return pg


def create_actors(cfg: RunConfig, run_dir: str, restore: bool) -> ActorSet:
    """One proposer, one solver, N verifiers, M scorer shards and a learner group of
    `learner.num_ranks` ranks, named by role; an eval actor when `eval.every_steps` > 0."""
    c, run = cfg.cluster, cfg.run.name
    n = cfg.scorer.num_scorers
    pgs = []
    pg = None
    plan = bundle_plan(cfg)
    roles: dict[str, int] = {}
    if plan is not None:
        bundles, roles = plan
        name = "+".join(["learner"] + (["generators"] if ipc_roles(cfg) else [])
                        + (["scorers"] if any(r.startswith("scorer") for r in roles) else []))
        pg = placement_group(bundles, strategy="STRICT_PACK", name=f"{run}:{name}")
        wait_placement_group(pg, c.startup_timeout_s)
        pgs.append(pg)
    learner_pg = pg or learner_placement(cfg)
    if learner_pg is not None and learner_pg is not pg:
        pgs.append(learner_pg)
    learner = create_learner(cfg, run_dir, restore, learner_pg)

    def where(role: str) -> tuple[Any, int | None]:
        return (pg, roles[role]) if role in roles else (None, None)

    scorers = [ScorerActor.options(**actor_options(
        c.scorer, f"{run}:scorer-{i}", RETRY_FOREVER, *where(f"scorer-{i}"))
    ).remote(cfg, i, n) for i in range(n)]
    proposer = ProposerActor.options(**actor_options(
        c.proposer, f"{run}:proposer", RESTART_ONLY, *where("proposer"))).remote(cfg)
    solver = SolverActor.options(**actor_options(
        c.solver, f"{run}:solver", RESTART_ONLY, *where("solver"))).remote(cfg)
    lean_fleet = make_lean_fleet(cfg) if uses_lean_fleet(cfg) else None
    verifiers = [VerifierActor.options(**actor_options(
        c.verifier, f"{run}:verifier-{i}", RETRY_FOREVER)).remote(cfg, lean_fleet)
        for i in range(c.num_verifiers)]
    evaluator = None
    if cfg.eval.every_steps:  # evaluate() is idempotent: retried on a restarted actor
        evaluator = EvalActor.options(**actor_options(
            c.eval, f"{run}:eval", RETRY_FOREVER)).remote(cfg)
    return ActorSet(proposer, solver, verifiers, scorers, learner, pgs, evaluator, learner_pg,
                    lean_fleet)
