"""`compassplay experiment selection --from DIR --out OUT --data-dir DATA`: what do the tasks
that each reward selects teach a solver, end to end?

Best-of-m selection from the untrained proposer's own verified tasks (the distribution a
KL-regularised RL proposer converges to, tilted by its reward, without its training noise):

1. The candidates of a utility experiment (`DIR/candidates.jsonl`, `commands.utility_measure`:
   every score at the start point's weights, each candidate's verified solutions) are shuffled
   (seeded) and split into disjoint subpools of `--subpool` candidates.
2. In each subpool each arm takes its top `--top` by its score: cos (the paper's reward),
   precond_cos (the cosine in the learner's AdamW metric), difficulty (1 - s, AZR), random
   (a seeded draw), and the positive control heldout_cos (the cosine with the primary
   endpoint's own gradient: an upper reference, circular on purpose).
3. Before any training, `OUT/design.json` states the minimum detectable effect at power 0.8 of
   the paired comparison (arm minus random over subpools), from the spread of the candidates'
   one-step utilities (`UTILITY_KEYS`) under simulated random selections.
4. For each (subpool, arm), the same solver (the start point: a run's checkpoint weights and
   AdamW state, `--checkpoint`; else the base model with a fresh AdamW) trains
   `--train-steps` AdamW steps on the mean loss of the selected tasks' verified solutions
   (each task weighted equally), and the drop of each endpoint's loss is measured:
   held-out MATH gold solutions (primary; disjoint from the reference and MATH500, the
   utility experiment's set), CRUXEval-O (program + input -> gold output) and GSM8K gold
   solutions (secondary). One row per (subpool, arm) in OUT/arms.jsonl, written as measured
   (a rerun continues).
5. OUT/summary.json and OUT/report.md: per arm the mean drop; per arm against random the
   paired mean difference over subpools with its t interval, a paired sign-flip permutation
   p, and the design's power. If the positive control does not beat random, the design is
   insensitive, and the report says so.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import time
from pathlib import Path

import numpy as np
import torch

from compassplay.commands.utility_experiment import read_rows
from compassplay.config import ConfigError, load_config

log = logging.getLogger(__name__)

ARMS = ("cos", "precond_cos", "difficulty", "random", "heldout_cos")
ENDPOINTS = ("heldout", "cruxeval_o", "gsm8k")
PRIMARY = "heldout"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `experiment selection` (the `experiment` parser shares --out, --data-dir,
    --base, --set, --checkpoint, --heldout-items, --max-target-tokens)."""
    p.add_argument("--from", dest="source", nargs="*", default=[], metavar="DIR",
                   help="selection: utility experiment folders whose candidates.jsonl is the "
                   "pool (their rows must hold prompt_ids and solutions)")
    p.add_argument("--subpool", type=int, default=10, help="selection: candidates per "
                   "subpool (m of best-of-m)")
    p.add_argument("--top", type=int, default=2, help="selection: tasks each arm takes per "
                   "subpool")
    p.add_argument("--train-steps", type=int, default=4, help="selection: solver AdamW steps "
                   "on an arm's selected tasks")
    p.add_argument("--train-lr", type=float, default=None, help="selection: the solver's "
                   "learning rate (default: the checkpoint's, else learner.lr)")
    p.add_argument("--secondary-items", type=int, default=24, help="selection: CRUXEval-O and "
                   "GSM8K items (0: primary endpoint only)")


def subpools(rows: list[dict], size: int, seed: int) -> list[list[dict]]:
    """Disjoint subpools of `size` candidates after a seeded shuffle (the remainder dropped)."""
    order = list(rows)
    random.Random(seed).shuffle(order)
    return [order[i:i + size] for i in range(0, len(order) - size + 1, size)]


def select(sub: list[dict], arm: str, k: int, seed: int) -> list[dict]:
    """The arm's top `k` of a subpool (random: a seeded draw); ties keep subpool order."""
    if arm == "random":
        return random.Random(seed).sample(sub, k)
    return sorted(sub, key=lambda r: -r[f"score_{arm}"])[:k]


UTILITY_KEYS = ("drop_adamw_heldout", "pred_adamw_heldout", "drop_sgd_heldout",
                "pred_sgd_heldout")
"""A candidate's one-step utility on the primary endpoint, first found: the realized drop of
the run's AdamW step, its first-order prediction, then the same for the plain step."""


def utility_of(r: dict) -> float:
    """A candidate's one-step utility on the primary endpoint (`UTILITY_KEYS`)."""
    for k in UTILITY_KEYS:
        if r.get(k) is not None:
            return float(r[k])
    raise ValueError(f"candidate {r.get('task_id')}: no one-step utility ({UTILITY_KEYS})")


def design_power(pools: list[list[dict]], k: int, sims: int = 2000, seed: int = 0) -> dict:
    """The minimum detectable effect (power 0.8, two-sided 0.05, paired over subpools) of an
    arm against random, from the spread of (mean utility of k random picks) - (mean of another
    k random picks) per subpool under `sims` simulations: an additive proxy of what training on
    the picks teaches (each candidate's one-step utility), in the same units (nats/token)."""
    rng = random.Random(seed)
    diffs = []
    for _ in range(sims):
        d = [np.mean([utility_of(r) for r in rng.sample(p, k)])
             - np.mean([utility_of(r) for r in rng.sample(p, k)]) for p in pools]
        diffs.append(float(np.mean(d)))
    sd_mean = float(np.std(diffs))
    s = len(pools)
    proxy = {arm: float(np.mean([np.mean([utility_of(r) for r in select(p, arm, k, 0)])
                                 - np.mean([utility_of(r) for r in p]) for p in pools]))
             for arm in ARMS if arm != "random"}
    return {"subpools": s, "top": k, "sd_of_paired_mean_difference": sd_mean,
            "mde_power_0.8": (1.959964 + 0.841621) * sd_mean,
            "proxy": "one-step utility (the first of " + ", ".join(UTILITY_KEYS) + ")",
            "proxy_arm_minus_subpool_mean": proxy}


_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """Student's t 0.975 quantile (table to 30 degrees of freedom, then 1.96 + 2.4 / df, within
    0.002 of the exact value)."""
    return _T975[df - 1] if df <= len(_T975) else 1.959964 + 2.4 / df


def paired(diffs: list[float], perms: int = 10000, seed: int = 0) -> dict:
    """Mean of paired differences, t interval (95%), sign-flip permutation p (two-sided)."""
    d = np.asarray(diffs, float)
    n = len(d)
    mean = float(d.mean()) if n else 0.0
    if n < 2:
        return {"mean": mean, "ci_low": mean, "ci_high": mean, "p": 1.0, "n": n,
                "wins": int((d > 0).sum())}
    se = float(d.std(ddof=1) / math.sqrt(n))
    t = t975(n - 1)
    rng = np.random.default_rng(seed)
    signs = rng.choice([-1.0, 1.0], size=(perms, n))
    hits = int((np.abs((signs * d).mean(1)) >= abs(mean) - 1e-15).sum())
    return {"mean": mean, "ci_low": mean - t * se, "ci_high": mean + t * se,
            "p": (hits + 1) / (perms + 1), "n": n, "wins": int((d > 0).sum())}


def endpoint_sets(tok, data: Path, reference_prompts: list[str], args: argparse.Namespace,
                  seed: int) -> dict[str, list]:
    """The endpoints' examples: held-out MATH (as the utility experiment), CRUXEval-O, GSM8K."""
    from compassplay.commands.utility_measure import heldout_math  # lazy: keeps the CLI start light
    from compassplay.rewards.batch import Example  # lazy: keeps the CLI start light
    from compassplay.step.prompting import chat_ids, target_ids  # lazy: keeps the CLI start light

    out = {PRIMARY: heldout_math(tok, data / "math_solutions.jsonl", reference_prompts,
                                 args.heldout_items, args.max_target_tokens, seed)}
    n = args.secondary_items
    if n <= 0:
        return out
    rng = random.Random(seed)
    crux_file, gsm_file = data / "cruxeval.jsonl", data / "gsm8k_test.jsonl"
    for f in (crux_file, gsm_file):
        if not f.is_file():
            raise ConfigError(f"--data-dir: {f} not found (--secondary-items 0 skips it)")
    crux = [json.loads(x) for x in crux_file.read_text().splitlines() if x.strip()]
    gsm = [json.loads(x) for x in gsm_file.read_text().splitlines() if x.strip()]
    out["cruxeval_o"] = [Example(chat_ids(tok, "What does this program return?\n```python\n"
                                           f"{r['code']}\nf({r['input']})\n```"),
                                 target_ids(tok, r["output"])[:args.max_target_tokens])
                         for r in rng.sample(crux, min(n, len(crux)))]
    out["gsm8k"] = [Example(chat_ids(tok, r["question"]),
                            target_ids(tok, r["answer"])[:args.max_target_tokens])
                    for r in rng.sample(gsm, min(n, len(gsm)))]
    return out


def train_drops(model: torch.nn.Module, tasks: list[dict], state: dict | None, lr: float,
                steps: int, max_grad_norm: float, losses: dict, before: dict[str, float],
                pad: int) -> dict[str, float]:
    """`steps` AdamW steps (continuing `state`, or fresh) on the mean over `tasks` of each
    task's mean solution loss; the endpoints' drops; the weights put back."""
    from compassplay.rewards.batch import Example  # lazy: keeps the CLI start light
    from compassplay.rewards.soar import mean_loss  # lazy: keeps the CLI start light
    from compassplay.rewards.utility import (  # lazy: keeps the CLI start light
        learner_adamw,
        restored,
    )

    with restored(model):
        params = [p for p in model.parameters() if p.requires_grad]
        opt = learner_adamw(params, lr, state)
        for g in opt.param_groups:  # `lr` here, also when continuing a state
            g["lr"] = lr
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = sum(mean_loss(model, [Example(t["prompt_ids"], s) for s in t["solutions"]],
                                 pad) for t in tasks) / len(tasks)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            opt.step()
        return {k: before[k] - fn(model) for k, fn in losses.items()}


def run_selection(args: argparse.Namespace) -> int:
    """The whole experiment; returns the exit code."""
    from compassplay.commands.utility_measure import load_start  # lazy: keeps the CLI start light
    from compassplay.rewards.fixed_set_loss import FixedSetLoss  # lazy: keeps the CLI start light
    from compassplay.rewards.reference_set import load_reference  # lazy: keeps the CLI start light

    if not args.source:
        raise ConfigError("--from: the selection experiment needs the folder of a measured "
                          "utility experiment (compassplay experiment utility --out DIR)")
    data = Path(args.data_dir) if args.data_dir else None
    if data is None or not (data / "math_solutions.jsonl").is_file():
        raise ConfigError(f"--data-dir: the held-out math set needs {data or 'DIR'}"
                          "/math_solutions.jsonl")
    cfg = load_config(args.base or "default", list(args.overrides))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [r for r in read_rows([Path(d) for d in args.source]) if r.get("solutions")]
    if args.top * 2 > args.subpool:
        raise ConfigError(f"--top {args.top}: at most half of --subpool {args.subpool}")
    pools = subpools(rows, args.subpool, cfg.run.seed)
    if len(pools) < 2:
        raise ConfigError(f"--from: {len(rows)} candidates with solutions make "
                          f"{len(pools)} subpools of {args.subpool}: at least 2 are needed")
    design = {"candidates": len(rows), **design_power(pools, args.top),
              "written_before_training": time.strftime("%Y-%m-%dT%H:%M:%S")}
    (out / "design.json").write_text(json.dumps(design, indent=1) + "\n")
    log.info("design: %d subpools of %d, top %d; MDE at power 0.8 = %.3g nats/token",
             len(pools), args.subpool, args.top, design["mde_power_0.8"])
    start = load_start(cfg, args.checkpoint)
    model, tok, pad = start.model, start.tok, start.tok.pad_token_id
    items = load_reference(cfg.reference.path)
    sets = endpoint_sets(tok, data, [it.prompt for it in items], args, cfg.run.seed)
    losses = {k: FixedSetLoss(model, v, pad) for k, v in sets.items()}
    before = {k: fn(model) for k, fn in losses.items()}
    lr = args.train_lr or (start.optimizer_state["param_groups"][0]["lr"]
                           if start.optimizer_state else cfg.learner.lr)
    arms_path = out / "arms.jsonl"
    done = {(r["subpool"], r["arm"]) for r in map(json.loads, arms_path.read_text().splitlines())
            if r} if arms_path.is_file() else set()
    t0 = time.time()
    total = len(pools) * len(ARMS)
    for i, sub in enumerate(pools):
        for arm in ARMS:
            if (i, arm) in done:
                continue
            t = time.time()
            picked = select(sub, arm, args.top, seed=cfg.run.seed * 1000 + i)
            drops = train_drops(model, picked, start.optimizer_state, lr, args.train_steps,
                                cfg.learner.max_grad_norm, losses, before, pad)
            row = {"subpool": i, "arm": arm, "tasks": [r["task_id"] for r in picked],
                   "task_types": [r["task_type"] for r in picked],
                   "scores": [r.get(f"score_{arm}") for r in picked],
                   **{f"drop_{k}": v for k, v in drops.items()},
                   "train_steps": args.train_steps, "lr": lr, "start": start.source}
            with arms_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            done.add((i, arm))
            log.info("[%d/%d] subpool %d %s: held-out drop %+.3g (%.1f s)", len(done), total, i,
                     arm, drops[PRIMARY], time.time() - t)
    summary = summarize(out, design, before, time.time() - t0)
    from compassplay.commands.selection_report import (
        write_report,  # lazy: keeps the CLI start light
    )

    print(f"selection experiment: {len(pools)} subpools; report: {write_report(out, summary)}")
    return 0


def summarize(out: Path, design: dict, before: dict, wall_s: float) -> dict:
    """OUT/summary.json from OUT/arms.jsonl."""
    rows = [json.loads(x) for x in (out / "arms.jsonl").read_text().splitlines() if x.strip()]
    by = {(r["subpool"], r["arm"]): r for r in rows}
    subs = sorted({r["subpool"] for r in rows})
    ends = [k[len("drop_"):] for k in rows[0] if k.startswith("drop_")] if rows else []
    summary: dict = {"design": design, "losses_before": before, "wall_s": wall_s,
                     "subpools": len(subs), "arms": {}, "against_random": {}}
    for arm in ARMS:
        summary["arms"][arm] = {e: float(np.mean([by[(s, arm)][f"drop_{e}"] for s in subs
                                                  if (s, arm) in by])) for e in ends}
        if arm == "random":
            continue
        summary["against_random"][arm] = {
            e: paired([by[(s, arm)][f"drop_{e}"] - by[(s, "random")][f"drop_{e}"]
                       for s in subs if (s, arm) in by and (s, "random") in by])
            for e in ends}
    ctrl = summary["against_random"].get("heldout_cos", {}).get(PRIMARY)
    summary["sensitive"] = bool(ctrl and ctrl["ci_low"] > 0)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
