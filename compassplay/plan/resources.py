"""What a run's actors ask the Ray cluster for, computed from the config alone (no Ray): each
role's resource bundle, the STRICT_PACK placement group's bundles, and whether a Lean fleet
runs. `actors.placement` creates the actors from these; `compassplay run --dry-run` prints them.
"""

from __future__ import annotations

from compassplay.config import ActorResources, RunConfig
from compassplay.sync.gpu_members import ipc_roles


def bundle(res: ActorResources) -> dict[str, float]:
    b = {"CPU": res.num_cpus, **res.resources}
    if res.num_gpus:
        b["GPU"] = res.num_gpus
    return {k: v for k, v in b.items() if v}


def merged(parts: list[ActorResources]) -> dict[str, float]:
    """One bundle holding every resource of `parts` (summed)."""
    out: dict[str, float] = {}
    for res in parts:
        for k, v in bundle(res).items():
            out[k] = out.get(k, 0.0) + v
    return out


def bundle_plan(cfg: RunConfig) -> tuple[list[dict[str, float]], dict[str, int]] | None:
    """The run's STRICT_PACK placement group, if it has one: (bundles, role -> bundle index;
    scorers as scorer-i). learner.weight_sync=ipc puts the learner and the vLLM generators in
    bundle 0 (one bundle: one node, and with GPU fractions adding up to at most 1 one GPU, as
    vLLM's examples/rl/rlhf_ipc.py does), else Ray may place them on different GPUs and
    the engines find no handles for theirs; `cluster.placement=pack_scorers_with_learner` adds
    the scorers' bundles (after the learner ranks')."""
    c, n, world = cfg.cluster, cfg.scorer.num_scorers, cfg.learner.num_ranks
    together = ipc_roles(cfg)
    if not together and c.placement != "pack_scorers_with_learner":
        return None
    if together:
        bundles = [merged([getattr(c, r) for r in together])]
        roles = dict.fromkeys(together, 0)
    else:
        bundles = [bundle(c.learner)] * world
        roles = {"learner": 0}
    if c.placement == "pack_scorers_with_learner":
        roles.update({f"scorer-{i}": len(bundles) + i for i in range(n)})
        bundles = bundles + [bundle(c.scorer)] * n
    return bundles, roles


def requests(cfg: RunConfig) -> dict[str, dict[str, float]]:
    """What each role's actor asks the cluster for (for logs and errors)."""
    c, ranks = cfg.cluster, cfg.learner.num_ranks
    out = {"learner": bundle(c.learner)} if ranks == 1 else {
        f"learner-{i}": bundle(c.learner) for i in range(ranks)}
    out.update({"proposer": bundle(c.proposer), "solver": bundle(c.solver)})
    out.update({f"verifier-{i}": bundle(c.verifier) for i in range(c.num_verifiers)})
    out.update({f"scorer-{i}": bundle(c.scorer) for i in range(cfg.scorer.num_scorers)})
    if cfg.eval.every_steps:
        out["eval"] = bundle(c.eval)
    if uses_lean_fleet(cfg):
        out["lean-fleet"] = {}
    return out


def uses_lean_fleet(cfg: RunConfig) -> bool:
    """Lean checks go to a LeanFleet (task.domain=lean, verifiers.lean.backend=fleet)."""
    return cfg.task.domain == "lean" and cfg.verifiers.lean.backend == "fleet"
