"""`compassplay run --dry-run`: build everything a run builds except the models, then stop.

Checks what a run would otherwise find out minutes (or GPU-hours) in: the environment (seed
programs, SOAR's held-out seeds, the Lean target set), the reference set, SOAR's held-out
problems and their disjointness from the reference set, the evaluation data, the GPU memory
plan (`plan.memory`: what each GPU role needs and whether the roles that may share a GPU fit),
the GPUs of NCCL groups and CUDA IPC (`sync.gpu_members`: no two members of one NCCL
communicator may share a GPU; the learner and vLLM generators of `weight_sync=ipc` must) and
the Ray executor's resource plan (`plan.resources`). A problem raises ConfigError naming the
field (exit code 2).
"""

from __future__ import annotations

from typing import Any

from compassplay.config import ConfigError, RunConfig
from compassplay.eval.benchmarks import find_data
from compassplay.eval.reference_build import problem_hash
from compassplay.plan.memory import plan_memory
from compassplay.plan.resources import bundle_plan, requests
from compassplay.rewards.reference_set import ReferenceFormatError, load_reference
from compassplay.sync.gpu_members import check_exclusive_gpus, check_ipc_colocation


def dry_run(cfg: RunConfig, executor: str = "ray") -> dict[str, Any]:
    """What the run would build, as a JSON-able dict; ConfigError at the first problem."""
    from compassplay.step.heldout import heldout_rows  # lazy: pulls torch
    from compassplay.workers.builders import make_env  # lazy: pulls torch

    out: dict[str, Any] = {"run": cfg.run.name, "domain": cfg.task.domain,
                           "task_types": list(cfg.task.types), "reward": cfg.reward.kind}
    try:
        env = make_env(cfg, None)
    except (OSError, ValueError) as exc:  # a seed/target file that is missing or malformed
        if isinstance(exc, ConfigError):
            raise
        field = "task.lean.target_file" if cfg.task.domain == "lean" else "task.seed_file"
        raise ConfigError(f"{field}: {exc}") from None
    out["environment"] = _describe_env(env)
    reference: set[str] = set()
    needs = cfg.reward.needs  # config.reward_kinds: what the reward kind reads
    if needs.reference_set(cfg.reward.reference) or cfg.logging.reference_loss:
        try:
            items = load_reference(cfg.reference.path, cfg.reference.max_items)
        except (OSError, ReferenceFormatError) as exc:
            raise ConfigError(f"reference.path: {exc}") from None
        reference = {problem_hash(it.prompt) for it in items}
        out["reference_items"] = len(items)
    if needs.heldout_loss and cfg.reward.soar_heldout != "seeds":
        rows = heldout_rows(cfg.reward.soar_heldout, cfg.reward.soar_heldout_items)
        shared = {problem_hash(p) for p, _, _ in rows} & reference
        if shared:
            raise ConfigError(f"reward.soar_heldout: {len(shared)} of its problems are in the "
                              f"reference set ({cfg.reference.path or 'shipped'}); held-out "
                              "problems must be disjoint from it")
        if len(rows) < cfg.reward.soar_heldout_items:
            raise ConfigError(f"reward.soar_heldout_items={cfg.reward.soar_heldout_items}: "
                              f"{cfg.reward.soar_heldout} holds only {len(rows)} problems")
        out["soar_heldout_items"] = len(rows)
    if cfg.eval.every_steps:
        out["eval_data"] = _eval_data(cfg)

    if executor == "ray":  # (the local executor syncs in process, on one device)
        check_exclusive_gpus(cfg)  # NCCL: no two ranks of one communicator on one GPU
        check_ipc_colocation(cfg)  # CUDA IPC: the learner and vLLM generators on one GPU
    out["memory_plan"] = plan_memory(cfg, executor).to_dict()  # ConfigError: does not fit
    if executor == "ray":
        plan = requests(cfg)
        packed = bundle_plan(cfg)
        if packed is not None:
            out["placement_group"] = {"strategy": "STRICT_PACK", "bundles": packed[0],
                                      "roles": packed[1]}
        out["resources"] = plan
        out["resources_total"] = {k: round(sum(r.get(k, 0.0) for r in plan.values()), 4)
                                  for k in ("CPU", "GPU")}
    return out


def _describe_env(env: Any) -> dict[str, Any]:
    info: dict[str, Any] = {"kind": type(env).__name__}
    buffer = getattr(env, "buffer", None)
    if buffer is not None and hasattr(buffer, "__len__"):
        info["buffer"] = len(buffer)
    if getattr(env, "heldout", None):
        info["heldout_seeds"] = len(env.heldout)
    targets = getattr(buffer, "targets", None)
    if targets is not None:
        info["targets"] = len(targets)
    return info


def _eval_data(cfg: RunConfig) -> dict[str, str]:
    """Each evaluation benchmark: its data file, or why it would be skipped."""
    data_dir = cfg.eval.data_dir or None
    out = {}
    for name in cfg.eval.benchmarks:
        try:
            path, looked = find_data(name, data_dir)
        except KeyError:
            raise ConfigError(f"eval.benchmarks: unknown benchmark {name!r}") from None
        out[name] = str(path) if path else "skipped: not found in " + ", ".join(looked)
    return out
