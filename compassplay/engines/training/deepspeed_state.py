"""Full (unsharded) weights and optimizer state of a DeepSpeed engine, by parameter name.

Every function here is collective over the learner group (ZeRO-3 gathers parameters, and
`safe_get_full_*` all-reduce the shards): all ranks call it, in the same order; only rank 0
keeps the full tensors (the others get {}). Parameters are gathered one at a time, so the
peak extra memory is one parameter, not the model.

Rank-count-independent checkpoint (`save_state` / `load_state`), next to the weights
(model.safetensors, written by the caller):

    optimizer.safetensors   per trainable parameter NAME: NAME/fp32 (master weights),
                            NAME/exp_avg, NAME/exp_avg_sq (AdamW moments), full shapes, fp32
    optimizer.json          {"step": AdamW step count, "names": [...], "zero_stage": k,
                            "world_size": N (of the writer, informational)}
    scheduler.pt            the LR scheduler's state_dict

A checkpoint written by N ranks restores into M ranks: each rank takes its own shard with
`safe_set_full_*`. Parameters are restored under `GatheredParameters(modifier_rank=0)`, never
by `load_state_dict` into partitioned tensors.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

MOMENTS = ("exp_avg", "exp_avg_sq")


def _rank() -> int:
    d = torch.distributed
    return d.get_rank() if d.is_available() and d.is_initialized() else 0


@contextmanager
def gathered(ds: Any, params: list[torch.nn.Parameter], zero_stage: int,
             modifier_rank: int | None = None) -> Iterator[None]:
    """ZeRO-3: the full `params` inside the block (`modifier_rank`'s changes are kept)."""
    ctx = (ds.zero.GatheredParameters(params, modifier_rank=modifier_rank) if zero_stage == 3
           else nullcontext())
    with ctx:
        yield


def full_state_dict(ds: Any, model: torch.nn.Module, zero_stage: int) -> dict[str, torch.Tensor]:
    """`model.state_dict()` with full tensors as detached CPU copies on rank 0 ({} elsewhere)."""
    rank0 = _rank() == 0
    params = dict(model.named_parameters(remove_duplicate=False))
    out: dict[str, torch.Tensor] = {}
    done: dict[int, torch.Tensor] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        p = params.get(name)
        if p is None:  # a buffer: never partitioned
            copy = t.detach().to("cpu", copy=True)
        elif id(p) in done:  # tied to a parameter already gathered
            copy = done[id(p)]
        else:
            with gathered(ds, [p], zero_stage):
                copy = done[id(p)] = t.detach().to("cpu", copy=True) if rank0 else t
        if rank0:
            out[name] = copy
    return out


def load_weights(ds: Any, model: torch.nn.Module, zero_stage: int,
                 weights: dict[str, torch.Tensor]) -> None:
    """Copy full `weights` (HF names; tied duplicates may be absent) into `model`'s
    parameters and persistent buffers (ZeRO-3: rank 0's copy is re-partitioned)."""
    params = dict(model.named_parameters())
    missing = [n for n in params if n not in weights]
    if missing:
        raise KeyError(f"weights do not match the model: missing={missing[:5]}")
    for name, p in params.items():
        with gathered(ds, [p], zero_stage, modifier_rank=0), torch.no_grad():
            if zero_stage < 3 or _rank() == 0:
                p.data.copy_(weights[name].to(p.dtype))
    for name, b in model.named_buffers():
        if name in weights:
            b.data.copy_(weights[name].to(b.dtype))


def _inner(engine: Any) -> torch.optim.Optimizer:
    """The torch optimizer that steps the flat fp32 partitions."""
    opt = engine.optimizer
    return getattr(opt, "optimizer", opt)


def _step_count(opt: torch.optim.Optimizer) -> int | None:
    for state in opt.state.values():
        if "step" in state:
            return int(state["step"])
    return None


def trainable(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def save_state(ds: Any, engine: Any, path: Path | None) -> None:
    """Write the optimizer files above under `path` (rank 0; other ranks pass None)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    step = _step_count(_inner(engine))
    names, tensors = [], {}
    for name, p in trainable(engine.module):
        names.append(name)
        full = {"fp32": safe_get_full_fp32_param(p)}
        if step is not None:
            full.update({k: safe_get_full_optimizer_state(p, k) for k in MOMENTS})
        if path is not None:
            tensors.update({f"{name}/{k}": v.detach().float().cpu().contiguous()
                            for k, v in full.items()})
    if path is None:
        return
    save_file(tensors, str(path / "optimizer.safetensors"))
    meta = {"step": step or 0, "names": names, "zero_stage": engine.zero_optimization_stage(),
            "world_size": torch.distributed.get_world_size()}
    (path / "optimizer.json").write_text(json.dumps(meta, indent=1))
    torch.save(engine.lr_scheduler.state_dict(), path / "scheduler.pt")


def _init_moments(engine: Any, step: int) -> None:
    """Create AdamW's (zero) state on a fresh engine so the moments can be set."""
    opt = _inner(engine)
    # ZeRO-3 hands the inner optimizer its flat fp32 partitions only during step()
    flat = getattr(engine.optimizer, "fp32_partitioned_groups_flat", None) or [
        p for group in opt.param_groups for p in group["params"]]
    for p in flat:
        st = opt.state[p]
        for k in MOMENTS:
            st.setdefault(k, torch.zeros_like(p))
        st["step"] = torch.tensor(float(step)) if isinstance(opt, torch.optim.AdamW) else step
    link = getattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
    if link is not None:  # ZeRO-1/2: point each parameter's fragment at the new state
        engine.optimizer._hp_optimizer_states_linked = False
        link()


def load_state(ds: Any, engine: Any, path: Path, weights: dict[str, torch.Tensor]) -> None:
    """Restore weights, fp32 master weights, AdamW moments and step, and the scheduler
    from `path` (written by `save_state` with any number of ranks). Collective."""
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    zero_stage = engine.zero_optimization_stage()
    load_weights(ds, engine.module, zero_stage, weights)
    meta = json.loads((path / "optimizer.json").read_text())
    params = trainable(engine.module)
    if [n for n, _ in params] != meta["names"]:
        raise ValueError(f"{path}: optimizer state is for other trainable parameters "
                         "(learner.trainable differs?)")
    if meta["step"]:
        _init_moments(engine, int(meta["step"]))
    with safe_open(str(path / "optimizer.safetensors"), framework="pt") as f:
        for name, p in params:
            safe_set_full_fp32_param(p, f.get_tensor(f"{name}/fp32").to(p.device))
            if meta["step"]:
                for k in MOMENTS:
                    safe_set_full_optimizer_state(p, f.get_tensor(f"{name}/{k}").to(p.device), k)
    _set_schedule(engine, torch.load(path / "scheduler.pt", weights_only=True))


def _set_schedule(engine: Any, state: dict[str, Any]) -> None:
    sched = engine.lr_scheduler
    sched.load_state_dict(state)
    for group, lr in zip(_inner(engine).param_groups, sched.get_last_lr(), strict=True):
        group["lr"] = lr


def reset(ds: Any, engine: Any, weights: dict[str, torch.Tensor],
          schedule: dict[str, Any]) -> None:
    """Weights and fp32 master weights <- `weights`, AdamW state emptied (re-created at the
    next step), scheduler <- `schedule`. Collective."""
    from deepspeed.utils import safe_set_full_fp32_param

    load_weights(ds, engine.module, engine.zero_optimization_stage(), weights)
    for name, p in trainable(engine.module):
        safe_set_full_fp32_param(p, weights[name].float().to(p.device))
    _inner(engine).state.clear()
    if hasattr(engine.optimizer, "_hp_optimizer_states_linked"):  # ZeRO-1/2: relink later
        engine.optimizer._hp_optimizer_states_linked = False
    _set_schedule(engine, schedule)
