"""One GPU per member of an NCCL communicator (no Ray).

NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected"). Two places
where that can happen:

* the weight-sync group (`learner.weight_sync=nccl`): the learner (rank 0), proposer, solver
  and every scorer; Ray may put fractional roles (`cluster.<role>.num_gpus` < 1) whose
  fractions add up to at most 1 on one GPU;
* the learner group (`learner.num_ranks` > 1 on GPUs, DeepSpeed over NCCL): its ranks all ask
  `cluster.learner`, so a fraction of at most 1/2 lets two of them share a GPU.

CUDA IPC (`learner.weight_sync=ipc`) needs the opposite: the learner and every vLLM generator
on one GPU (`ipc_roles`; the Ray executor places them in one STRICT_PACK bundle,
`plan.resources.bundle_plan`), so their `num_gpus` must be fractions adding up to at most 1
(`check_ipc_colocation`).

`check_exclusive_gpus(cfg)` refuses such configs before anything starts (`--dry-run` and the
driver), naming the roles; `check_distinct_devices` checks the physical devices the members
report when a group forms (`sync.identity.device_id`, the GPU's UUID), naming the ranks.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

from compassplay.config import ConfigError, RunConfig

EPS = 1e-9


def weight_sync_members(cfg: RunConfig) -> list[tuple[str, float]]:
    """(role, cluster.<role>.num_gpus) of every process of the weight-sync group's roles: the
    learner's rank 0, proposer, solver, each scorer (a vLLM engine's TP workers get GPUs of
    their own from vLLM, so the engine counts once)."""
    c = cfg.cluster
    out = [("learner", c.learner.num_gpus), ("proposer", c.proposer.num_gpus),
           ("solver", c.solver.num_gpus)]
    out += [(f"scorer-{i}", c.scorer.num_gpus) for i in range(cfg.scorer.num_scorers)]
    return out


def may_share(members: list[tuple[str, float]]) -> list[tuple[str, str]]:
    """Pairs of members Ray may put on one GPU: both fractional, fractions adding up to <= 1
    (a member with >= 1 GPU has its GPUs to itself; one without a GPU needs no NCCL device)."""
    frac = [(n, g) for n, g in members if 0 < g < 1]
    return [(a, b) for (a, ga), (b, gb) in combinations(frac, 2) if ga + gb <= 1 + EPS]


def check_exclusive_gpus(cfg: RunConfig) -> None:
    """ConfigError when two members of one NCCL communicator may share a GPU (see the module
    docstring), naming the roles and the fields."""
    if cfg.learner.weight_sync == "nccl":
        pairs = may_share(weight_sync_members(cfg))
        if pairs:
            names = ", ".join(f"{a} + {b}" for a, b in pairs[:6])
            fields = sorted({f"cluster.{n.split('-')[0]}.num_gpus" for p in pairs for n in p})
            raise ConfigError(
                f"learner.weight_sync=nccl: {names} may share one GPU (fractional num_gpus "
                "adding up to at most 1), and NCCL refuses two ranks of one communicator on "
                f"one GPU; give each a GPU of its own ({', '.join(fields)} >= 1, or "
                "fractions that cannot add up to one GPU) or use "
                "learner.weight_sync=object_store")
    g, n = cfg.cluster.learner.num_gpus, cfg.learner.num_ranks
    if n > 1 and 0 < g <= 0.5 + EPS:
        raise ConfigError(
            f"cluster.learner.num_gpus={g}: the {n} ranks of the learner group "
            f"(learner.num_ranks) form one NCCL group and two of them may share a GPU, which "
            "NCCL refuses; give each rank a GPU of its own (cluster.learner.num_gpus >= 1)")


def ipc_roles(cfg: RunConfig) -> list[str]:
    """learner.weight_sync=ipc: the roles that share the learner's GPU (the learner, then
    each vLLM generator); [] otherwise."""
    if cfg.learner.weight_sync != "ipc":
        return []
    return ["learner"] + [r for r in ("proposer", "solver") if getattr(cfg, r).engine == "vllm"]


def check_ipc_colocation(cfg: RunConfig) -> None:
    """ConfigError when the learner and the vLLM generators of learner.weight_sync=ipc cannot
    share one GPU: each needs a fraction of it, adding up to at most 1."""
    roles = ipc_roles(cfg)
    gpus = {r: getattr(cfg.cluster, r).num_gpus for r in roles}
    if len(roles) < 2 or all(0 < g < 1 for g in gpus.values()) \
            and sum(gpus.values()) <= 1 + EPS:
        return
    terms = " + ".join(f"cluster.{r}.num_gpus {g:g}" for r, g in gpus.items())
    raise ConfigError(
        f"learner.weight_sync=ipc: {', '.join(roles)} must share one GPU (CUDA IPC handles "
        f"open only on the GPU that made them; they are placed in one bundle), but {terms} = "
        f"{sum(gpus.values()):g}; give each a fraction of one GPU adding up to at most 1 "
        "(e.g. 0.4 + 0.3 + 0.3), or use learner.weight_sync=nccl")


def gather_device_ids(comm: Any, rank: int, world_size: int, mine: str) -> list[str]:
    """Every member's device id, by rank (collective over `comm`'s `broadcast_object`, a
    `sync.buckets.Broadcaster`: each rank sends its own in turn)."""
    return [comm.broadcast_object(mine if r == rank else None, r) for r in range(world_size)]


def check_distinct_devices(ids: list[str], what: str = "weight-sync group") -> None:
    """RuntimeError when two ranks report the same GPU (`ids[rank]`, `device_id`)."""
    seen: dict[str, list[int]] = {}
    for r, d in enumerate(ids):
        seen.setdefault(d, []).append(r)
    dup = {d: rs for d, rs in seen.items() if len(rs) > 1}
    if dup:
        detail = "; ".join(f"ranks {rs} on {d}" for d, rs in dup.items())
        raise RuntimeError(
            f"{what}: {detail}. NCCL refuses two ranks of one communicator on one GPU "
            "(ranks: 0 the learner, then the proposer's, the solver's and each scorer's, "
            "sync.ranks); give every member a GPU of its own (cluster.<role>.num_gpus)")
