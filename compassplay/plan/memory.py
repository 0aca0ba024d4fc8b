"""The GPU memory plan of a run: what each role placed on a GPU needs (`plan.role_memory`), and
whether the roles sharing a GPU fit (pure: no Ray, no torch; `compassplay run --dry-run`
prints it).

Which roles share a GPU: a role asking for >= 1 GPU has its GPUs to itself; Ray may put any
set of fractional roles whose `num_gpus` add up to at most 1 on one GPU, so every such set is
checked (the local executor runs every GPU role on one GPU). A GPU is checked in phases:
*generate* (engines awake; the learner holds only its resident state: it releases torch's
cache after its step, `LearnerWorker.learn`), *score*, *learn* (sleeping engines hold
nothing) and *sync*; with `pipeline.staleness` > 0 rollout overlaps scoring and learning, so
engines count awake in every phase. vLLM checks its fraction against the *free* memory when it
starts: the fractions of engines on one GPU plus the other roles' share must add up to <= 1.
vLLM 0.32 makes that startup check even when `kv_cache_mb` sizes the KV cache (*start*: the
engine starting last asks for its full fraction beside what the others hold). A GPU that does
not fit raises ConfigError naming the largest role's knob, with the numbers in GiB.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from compassplay.config import ConfigError, RunConfig
from compassplay.plan.role_memory import PHASES, GiB, MiB, RoleMemory, gib, gpu_roles
from compassplay.plan.shapes import Shape, shape_of

CUDA_CONTEXT_BYTES = 512 * MiB  # per process per GPU: CUDA context, cuBLAS/NCCL workspaces
MAX_SUBSET_ROLES = 14  # fractional roles checked in every combination (2^14 sets) at most


@dataclass
class GpuCheck:
    """One GPU (or a set of fractional roles Ray may put on one): the worst phase."""

    roles: list[str]
    phase: str
    need: int  # bytes in the worst phase, CUDA contexts included
    total: int

    def to_dict(self) -> dict[str, Any]:
        return {"roles": self.roles, "worst_phase": self.phase, "need_gib": gib(self.need),
                "total_gib": gib(self.total), "fits": self.need <= self.total}


@dataclass
class MemoryPlan:
    gpu_bytes: int
    shape: Shape | None
    shape_source: str
    roles: list[RoleMemory] = field(default_factory=list)
    gpus: list[GpuCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        if self.shape is None:
            return {"skipped": self.shape_source}
        return {"gpu_memory_gib": gib(self.gpu_bytes),
                "model": {"shape": self.shape.name, "from": self.shape_source,
                          "params": self.shape.params()},
                "roles": {r.name: r.to_dict() for r in self.roles},
                "gpus": [g.to_dict() for g in self.gpus], "notes": self.notes}


# ------------------------------------------------------------------------------ GPUs
def check_gpu(roles: list[RoleMemory], total: int) -> GpuCheck:
    """The worst phase of `roles` sharing one GPU."""
    contexts = sum(r.processes for r in roles) * CUDA_CONTEXT_BYTES
    need = {ph: sum(r.phases[ph] for r in roles) + contexts for ph in PHASES}
    # an engine starting last asks for gpu_memory_utilization x total free beside the others
    need["start"] = need["generate"] + max((r.start_extra for r in roles), default=0)
    worst = max(need, key=lambda ph: need[ph])
    label = "every" if len(set(need.values())) == 1 else worst
    return GpuCheck([r.name for r in roles], label, need[worst], total)


def sharing_sets(roles: list[RoleMemory], local: bool) -> list[list[RoleMemory]]:
    """The sets of roles that may share one GPU: the local executor puts every role on one;
    under Ray a role with >= 1 GPU is alone, and fractional roles may share in every
    combination whose fractions add up to at most 1 (only maximal sets are returned)."""
    if local:
        return [roles] if roles else []
    out = [[r] for r in roles if r.num_gpus >= 1]
    frac = [r for r in roles if r.num_gpus < 1]
    if len(frac) > MAX_SUBSET_ROLES:  # first fit in placement order instead
        groups: list[list[RoleMemory]] = []
        for r in frac:
            for g in groups:
                if sum(x.num_gpus for x in g) + r.num_gpus <= 1 + 1e-9:
                    g.append(r)
                    break
            else:
                groups.append([r])
        return out + groups
    def fits(group: list[RoleMemory]) -> bool:
        return sum(r.num_gpus for r in group) <= 1 + 1e-9

    # maximal: no other fractional role could join the set
    sets = [list(s) for k in range(len(frac), 0, -1) for s in combinations(frac, k)
            if fits(list(s))]
    return out + [s for s in sets if not any(r not in s and fits([*s, r]) for r in frac)]


def explain(check: GpuCheck, roles: list[RoleMemory]) -> str:
    """`field: numbers` for a GPU that does not fit (the largest role's knob)."""
    if check.phase == "start":
        big = max(roles, key=lambda r: r.start_extra)
        asked = gib(big.start_extra + big.phases["generate"])
        return (f"{big.name}.gpu_memory_utilization: vLLM asks for gpu_memory_utilization x "
                f"the GPU's total memory free when it starts ({asked} GiB here, even though "
                f"kv_cache_mb sizes its KV cache), but the roles that may share its GPU "
                f"({', '.join(check.roles)}) leave less: {gib(check.need)} GiB needed of "
                f"{gib(check.total)} GiB (cluster.gpu_memory_gib)")
    phase = PHASES[0] if check.phase == "every" else check.phase
    big = max(roles, key=lambda r: r.phases[phase])
    terms = " + ".join(f"{r.name} {gib(r.phases[phase])}" for r in roles)
    ctx = gib(sum(r.processes for r in roles) * CUDA_CONTEXT_BYTES)
    when = "every phase" if check.phase == "every" else f"the {check.phase} phase"
    msg = (f"{big.knob}: the roles that may share one GPU ({', '.join(check.roles)}) need "
           f"{gib(check.need)} GiB in {when} ({terms} + CUDA contexts {ctx} GiB) but it has "
           f"{gib(check.total)} GiB (cluster.gpu_memory_gib)")
    engines = [r for r in roles if r.knob.endswith(".gpu_memory_utilization")]
    if engines and len(roles) > 1:
        fractions = " + ".join(f"{r.name} {r.phases['generate'] / check.total:.2f}"
                               for r in roles)
        msg += (f"; vLLM reserves gpu_memory_utilization x the GPU's total memory and checks "
                f"it against the memory free when the engine starts, so the fractions of "
                f"the roles on one GPU must add up to at most 1: here {fractions}")
    return msg


def plan_memory(cfg: RunConfig, executor: str = "ray", gpu_gib: float | None = None
                ) -> MemoryPlan:
    """The plan of `cfg` on GPUs of `gpu_gib` GiB (default cluster.gpu_memory_gib); raises
    ConfigError (naming the field) when the roles that may share a GPU do not fit."""
    total = int((gpu_gib if gpu_gib is not None else cfg.cluster.gpu_memory_gib) * GiB)
    shape, source = shape_of(cfg.model)
    plan = MemoryPlan(total, shape, source)
    if shape is None:
        return plan
    plan.roles = gpu_roles(cfg, shape, total)
    if not plan.roles:
        plan.notes.append("no role asks for a GPU (cluster.<role>.num_gpus = 0): nothing to "
                          "check")
        return plan
    plan.notes.append("vLLM engines reserve gpu_memory_utilization x total GPU memory, "
                      "checked against free memory at their start: on a shared GPU the "
                      "fractions plus the other roles' share add up to at most 1")
    failures = []
    for group in sharing_sets(plan.roles, executor == "local"):
        check = check_gpu(group, total)
        plan.gpus.append(check)
        if check.need > total:
            failures.append((check.need - check.total, check, group))
    if failures:
        _, check, group = max(failures, key=lambda f: f[0])
        raise ConfigError(explain(check, group))
    return plan


def colocated(cfg: RunConfig) -> bool:
    """The learner shares its GPU with engines that sleep or with other roles: it must give
    torch's cached blocks back after its step (`LearnerWorker.learn`)."""
    sleeping = any(getattr(cfg, r).engine == "vllm" and getattr(cfg, r).enable_sleep_mode
                   for r in ("proposer", "solver"))
    return cfg.learner.weight_sync == "ipc" or sleeping or 0 < cfg.cluster.learner.num_gpus < 1
