"""Create the actors of a run with the resources and placement the config asks for."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from compassplay.actors.roles import (
    LearnerActor,
    ProposerActor,
    ScorerActor,
    SolverActor,
    VerifierActor,
)
from compassplay.config import ActorResources, RunConfig

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
    learner: Any
    placement_groups: list[Any] = field(default_factory=list)

    def all(self) -> list[Any]:
        return [self.proposer, self.solver, *self.verifiers, *self.scorers, self.learner]

    def shutdown(self) -> None:
        for a in self.all():
            ray.kill(a, no_restart=True)
        for pg in self.placement_groups:
            remove_placement_group(pg)


def _bundle(res: ActorResources) -> dict[str, float]:
    b = {"CPU": res.num_cpus, **res.resources}
    if res.num_gpus:
        b["GPU"] = res.num_gpus
    return {k: v for k, v in b.items() if v}


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


def create_actors(cfg: RunConfig, run_dir: str, restore: bool) -> ActorSet:
    """One proposer, one solver, N verifiers, M scorer shards and one learner, named by role."""
    c, run = cfg.cluster, cfg.run.name
    n = cfg.scorer.num_scorers
    pgs = []
    pg = None
    if c.placement == "pack_scorers_with_learner":
        pg = placement_group([_bundle(c.learner)] + [_bundle(c.scorer)] * n,
                             strategy="STRICT_PACK", name=f"{run}:learner+scorers")
        ray.get(pg.ready())
        pgs.append(pg)
    learner = LearnerActor.options(**actor_options(
        c.learner, f"{run}:learner", RESTART_ONLY, pg, 0)).remote(cfg, run_dir, restore)
    scorers = [ScorerActor.options(**actor_options(
        c.scorer, f"{run}:scorer-{i}", RETRY_FOREVER, pg, None if pg is None else i + 1)
    ).remote(cfg, i, n) for i in range(n)]
    proposer = ProposerActor.options(**actor_options(
        c.proposer, f"{run}:proposer", RESTART_ONLY)).remote(cfg)
    solver = SolverActor.options(**actor_options(
        c.solver, f"{run}:solver", RESTART_ONLY)).remote(cfg)
    verifiers = [VerifierActor.options(**actor_options(
        c.verifier, f"{run}:verifier-{i}", RETRY_FOREVER)).remote(cfg)
        for i in range(c.num_verifiers)]
    return ActorSet(proposer, solver, verifiers, scorers, learner, pgs)
