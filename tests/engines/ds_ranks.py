"""Run a DeepSpeed learner group of N ranks as N spawned processes (gloo, CPU accelerator).

`run_group(world, plan, out)` starts `world` processes; each builds the learner of
`plan["stages"]` (one ZeRO stage after the other, in the same process group), optionally loads
a checkpoint, takes one learner step per trajectory seed in `plan["seeds"]` and optionally
saves after step index `plan["save_after"]`. Rank 0 writes, per stage, `out/z{stage}.pt`:
{"weights": [full state dict after each step], "stats": [LearnerStats dicts]}. Each rank's
stdout and stderr go to `out/rank{r}.log`; a failed group raises with their tails.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

LR = 1e-3


def learner_cfg(stage: int):
    from compassplay.config import LearnerSection

    return LearnerSection(backend="deepspeed", zero_stage=stage, lr=LR, micro_batch=2,
                          max_grad_norm=0.5, schedule="linear", mini_batch_size=0)


def _rank_main(rank: int, world: int, port: int, plan: dict[str, Any], out: str) -> None:
    log = open(Path(out) / f"rank{rank}.log", "w")  # noqa: SIM115 -- this process's fd 1 and 2
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    _rank_work(rank, world, port, plan, out)
    sys.stdout.flush()
    sys.stderr.flush()
    # The results are written and the group is destroyed: skip the interpreter's teardown, whose
    # C++ destructors (gloo, DeepSpeed's ops) have nothing left to do for this test.
    os._exit(0)


def _rank_work(rank: int, world: int, port: int, plan: dict[str, Any], out: str) -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    torch.set_num_threads(1)
    from compassplay.engines.factory import make_learner
    from compassplay.engines.training import deepspeed as deepspeed_learner
    from compassplay.engines.training.dist import RankInfo, leave_group
    from tests.tiny_models import synthetic_trajectories, tiny_causal_lm

    base = deepspeed_learner.ds_config

    def small_params_partitioned(cfg, dtype):  # the tiny model's tensors are all < 1e5
        conf = base(cfg, dtype)
        if cfg.zero_stage == 3:
            conf["zero_optimization"]["stage3_param_persistence_threshold"] = 0
        return conf

    deepspeed_learner.ds_config = small_params_partitioned
    behaviour = tiny_causal_lm(seed=2)
    batches = [synthetic_trajectories(behaviour, n=9, seed=s) for s in plan["seeds"]]
    info = RankInfo(rank, world, "127.0.0.1", port, timeout_s=120.0)
    for stage in plan["stages"]:
        learner = make_learner(learner_cfg(stage), tiny_causal_lm(seed=2), total_steps=6,
                               dist=info)
        if stage == 3 and world > 1:  # ZeRO-3 really partitions: each rank holds 1/world
            module = learner.slots["policy"].engine.module
            assert all(p.ds_tensor.numel() < p.ds_numel for p in module.parameters())
        if plan.get("load"):
            learner.load(Path(plan["load"]) / f"z{stage}")
        weights, stats = [], []
        for i, batch in enumerate(batches):
            stats.append(learner.step(batch).to_dict())
            weights.append(learner.state_dict_for_sync())
            if plan.get("save_after") == i:
                learner.save(Path(plan["save_to"]) / f"z{stage}")
        if rank == 0:
            torch.save({"weights": weights, "stats": stats}, Path(out) / f"z{stage}.pt")
        else:
            assert all(w == {} for w in weights)  # only rank 0 holds the full weights
    leave_group()


def run_group(world: int, plan: dict[str, Any], out: Path) -> dict[int, dict[str, Any]]:
    """Run `plan` on `world` ranks; returns {stage: rank 0's record}."""
    from compassplay.engines.training.dist import free_port

    out.mkdir(parents=True, exist_ok=True)
    try:
        torch.multiprocessing.start_processes(
            _rank_main, args=(world, free_port("127.0.0.1"), plan, str(out)), nprocs=world,
            join=True, start_method="spawn")
    except Exception as exc:  # name the rank's own last words (its stderr is in a file)
        logs = {r: (out / f"rank{r}.log") for r in range(world)}
        tails = "\n".join(f"--- rank {r}:\n" + p.read_text(errors="replace")[-3000:]
                          for r, p in logs.items() if p.exists())
        raise RuntimeError(f"learner group of {world} failed: {exc}\n{tails}") from exc
    return {s: torch.load(out / f"z{s}.pt", weights_only=False) for s in plan["stages"]}


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
