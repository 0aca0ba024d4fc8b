"""`compassplay experiment utility --out DIR --data-dir DATA`: does the cosine pick the tasks
that teach?

1. Pool: self-play rollouts with the run's workers and no learning (propose, validate, solve,
   grade, build candidates; `step.graph.submit_step(stop_after="candidates")`) until at least
   `--candidates` eligible candidates (0 < s(x) < 1, with a verified solution) are collected.
   Written to DIR/pool.jsonl; a rerun reuses it.
2. From the same weights, each candidate's score under every reward (cosine, inner product,
   difficulty 1 - s, novelty, cos x novelty, a seeded random score) and its realized utility
   (`rewards.utility`): the drop of the held-out math loss (MATH problems with worked solutions
   from DATA/math_solutions.jsonl, disjoint from the reference set and MATH500) and of the
   reference loss after one step of the learner's optimizer on its verified solution, and,
   for the first-order check, the realized reference-loss drop after a plain SGD step of size
   `--eta` against its prediction eta * <g, g_ref>. One row per candidate in
   DIR/candidates.jsonl, written as it is measured (a rerun continues).
3. DIR/summary.json (Spearman rho of each score with each utility: bootstrap interval over
   candidates, permutation p; top-k mean utility per score; the first-order fit; the smallest
   rho the pool can detect) and DIR/report.md with its figures.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import time
from pathlib import Path

from compassplay.config import ConfigError, RunConfig, load_config

log = logging.getLogger(__name__)

SCORES = ("cos", "inner", "difficulty", "novelty", "cos_novelty", "random")
POOL_FILE, ROWS_FILE = "pool.jsonl", "candidates.jsonl"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of the utility experiment (the `experiment` parser shares --out, --data-dir,
    --base and --set)."""
    p.add_argument("--candidates", type=int, default=60, help="utility: eligible candidates "
                   "to collect (the pool)")
    p.add_argument("--proposals-per-type", type=int, default=16, help="utility: proposals "
                   "per task type and rollout step while collecting the pool (proposer."
                   "batch_size; 16 gives about 11 eligible candidates a step with SmolLM2-135M)")
    p.add_argument("--max-steps", type=int, default=200, help="utility: rollout steps at most "
                   "while collecting the pool")
    p.add_argument("--heldout-items", type=int, default=24, help="utility: held-out MATH "
                   "problems")
    p.add_argument("--max-target-tokens", type=int, default=160, help="utility: held-out gold "
                   "solutions are cut to this many tokens")
    p.add_argument("--eta", type=float, default=1e-4, help="utility: SGD step size of the "
                   "first-order check (SmolLM2-135M: at 1e-3 the second-order term, about "
                   "-3e-3 nats, swamps the first-order one, about 6e-4; at 1e-4 r = 0.96)")
    p.add_argument("--lr", type=float, default=None, help="utility: learning rate of the "
                   "optimizer step (default: the config's learner.lr)")


def run_utility(args: argparse.Namespace) -> int:
    """The whole experiment; returns the exit code."""
    base = args.base or "default"
    # the pool holds proposals only: no seed (buffer) task is solved (--set may override)
    cfg = load_config(base, [f"proposer.batch_size={args.proposals_per_type}",
                             "solver.seed_tasks_per_step=0", *args.overrides])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = Path(args.data_dir) / "math_solutions.jsonl" if args.data_dir else None
    if data is None or not data.is_file():
        raise ConfigError(f"--data-dir: the held-out math set needs {data or 'DIR'}"
                          "/math_solutions.jsonl (MATH problems with worked solutions)")
    t0 = time.time()
    pool = collect_pool(cfg, out / POOL_FILE, args.candidates, args.max_steps)
    if len(pool) < 3:
        log.error("only %d eligible candidates after %d steps: nothing to rank", len(pool),
                  args.max_steps)
        return 1
    measure(cfg, pool[:args.candidates], data, out, args)
    summary = summarize(out, base, args, time.time() - t0)
    from compassplay.run.utility_report import write_report

    report = write_report(out, summary)
    print(f"utility experiment: {summary['n']} candidates; report: {report}")
    return 0


def collect_pool(cfg: RunConfig, path: Path, want: int, max_steps: int) -> list[dict]:
    """Eligible candidates (as JSON rows) from rollouts without learning; appends to `path`
    and starts from what it already holds."""
    pool = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] \
        if path.is_file() else []
    if len(pool) >= want:
        log.info("pool: %d candidates in %s (kept)", len(pool), path)
        return pool
    from compassplay.executors.local import InProcess
    from compassplay.step.graph import submit_step
    from compassplay.step.messages import Validated
    from compassplay.workers.generator_workers import ProposerWorker, SolverWorker
    from compassplay.workers.scorer_worker import ScorerWorker
    from compassplay.workers.verifier_worker import VerifierWorker

    workers = {"proposer": [ProposerWorker(cfg)], "solver": [SolverWorker(cfg)],
               "verifier": [VerifierWorker(cfg)], "scorer": [ScorerWorker(cfg)],
               "learner": []}
    weights = {"proposer": (0, [None]), "solver": (0, [None])}
    start = 1 + max((r["step"] for r in pool), default=-1)
    try:
        for step in range(start, start + max_steps):
            if len(pool) >= want:
                break
            t = time.time()
            got = submit_step(step, InProcess(workers), weights, False, cfg.task.domain,
                              stop_after="candidates")
            tasks = {t.task_id: t for t in Validated.merge(got["validate"]).solved}
            rows = [{"step": step, **c.model_dump(mode="json"),
                     "task": tasks[c.task_id].model_dump(mode="json")}
                    for c in got["candidates"].cands]
            with path.open("a") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
            pool += rows
            log.info("pool step %d: %d proposals valid, %d eligible (%d/%d, %.0f s)", step,
                     sum(t.valid for t in Validated.merge(got["validate"]).tasks), len(rows),
                     len(pool), want, time.time() - t)
    finally:
        for v in workers["verifier"]:
            v.close()
    return pool


def heldout_math(tok, data: Path, reference_prompts: list[str], n: int, max_target: int,
                 seed: int):
    """`n` MATH problems (chat prompt -> worked solution cut to `max_target` tokens), none in
    the reference set or MATH500."""
    from compassplay.eval.reference_build import problem_hash, read_file, select
    from compassplay.rewards.batch import Example
    from compassplay.step.prompting import chat_ids, target_ids

    rows, _ = select(read_file(data), n, seed,
                     exclude={problem_hash(p) for p in reference_prompts})
    return [Example(chat_ids(tok, r["problem"]), target_ids(tok, r["solution"])[:max_target])
            for r in rows]


def measure(cfg: RunConfig, pool: list[dict], data: Path, out: Path,
            args: argparse.Namespace) -> None:
    """Scores and utilities of every pool candidate not yet in candidates.jsonl."""
    from compassplay.models.bootstrap import load_policy
    from compassplay.rewards.batch import Example
    from compassplay.rewards.fixed_set_loss import FixedSetLoss
    from compassplay.rewards.functions import token_jaccard
    from compassplay.rewards.gradient import GradientScorer
    from compassplay.rewards.reference_set import load_reference
    from compassplay.rewards.utility import (
        StepDrops,
        first_order_drop,
        loss_gradient,
        optimizer_step_drops,
    )
    from compassplay.step.prompting import reference_examples
    from compassplay.workers.builders import freeze_except, scorer_params

    rows_path = out / ROWS_FILE
    done = {json.loads(x)["task_id"] for x in rows_path.read_text().splitlines() if x.strip()} \
        if rows_path.is_file() else set()
    todo = [c for c in pool if c["task_id"] not in done]
    if not todo:
        return
    model, tok = load_policy(cfg)
    model = model.float()
    # as in a run: the learner steps `learner.trainable`, the cosine is over `scorer.params`
    freeze_except(model, cfg.learner.trainable, "learner.trainable")
    pad = tok.pad_token_id
    items = load_reference(cfg.reference.path, cfg.reference.max_items)
    reference = reference_examples(tok, items)
    heldout = heldout_math(tok, data, [it.prompt for it in items], args.heldout_items,
                           args.max_target_tokens, cfg.run.seed)
    examples = [Example(c["prompt_ids"], c["target_ids"]) for c in todo]
    scorer = GradientScorer(model, params=scorer_params(cfg.scorer.params, model), pad_id=pad,
                            max_batch_tokens=cfg.scorer.max_batch_tokens,
                            cpu_pass_tokens=cfg.scorer.cpu_pass_tokens)
    scorer.set_reference(reference)
    part = scorer.partials(examples)
    ref_sq = float(scorer.reference.sq)
    heldout_loss, reference_loss = FixedSetLoss(model, heldout, pad), \
        FixedSetLoss(model, reference, pad)
    before = StepDrops(heldout_loss(model), reference_loss(model))
    g_ref = loss_gradient(model, reference, pad)
    lr = args.lr or cfg.learner.lr
    rng = random.Random(cfg.run.seed)
    log.info("measuring %d candidates (held-out loss %.4f, reference loss %.4f nats/token; "
             "%d frozen layers cached)", len(todo), before.heldout, before.reference,
             heldout_loss.prefix_layers)
    for i, (c, ex) in enumerate(zip(todo, examples, strict=True)):
        t = time.time()
        inner, sq = float(part.inner[i]), float(part.sq[i])
        cos = inner / math.sqrt(sq * ref_sq) if sq > 0 and ref_sq > 0 else 0.0
        nov = 1.0 - token_jaccard(c.get("novelty_tokens", []), c.get("seed_tokens", []))
        grad = loss_gradient(model, [ex], pad)
        drops = optimizer_step_drops(model, grad, heldout_loss, reference_loss, before, lr=lr,
                                     max_grad_norm=cfg.learner.max_grad_norm)
        realized, predicted = first_order_drop(model, grad, reference_loss, before.reference,
                                               g_ref, eta=args.eta)
        row = {"task_id": c["task_id"], "task_type": c["task_type"], "step": c["step"],
               "solve_rate": c["solve_rate"], "score_cos": cos, "score_inner": inner,
               "score_difficulty": 1.0 - c["solve_rate"], "score_novelty": nov,
               "score_cos_novelty": cos * nov, "score_random": rng.random(),
               "utility": drops.heldout, "utility_ref": drops.reference,
               "sgd_drop_ref": realized, "sgd_predicted_ref": predicted,
               "grad_norm": math.sqrt(sq), "target_tokens": len(c["target_ids"]),
               "heldout_loss_before": before.heldout, "reference_loss_before": before.reference,
               "lr": lr, "eta": args.eta, "task": c["task"],
               "solution": tok.decode(c["target_ids"], skip_special_tokens=True)}
        with rows_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        log.info("[%d/%d] %s cos=%+.4f utility=%+.5f ref=%+.5f (%.1f s)", i + 1, len(todo),
                 c["task_id"], cos, drops.heldout, drops.reference, time.time() - t)


def summarize(out: Path, base: str, args: argparse.Namespace, wall_s: float) -> dict:
    """summary.json from candidates.jsonl."""
    from compassplay.eval.rank_stats import detectable_rho, line_fit, rank_correlation, top_k_mean

    rows = [json.loads(x) for x in (out / ROWS_FILE).read_text().splitlines() if x.strip()]
    n = len(rows)
    k = max(3, n // 10)
    summary: dict = {"n": n, "config": base, "overrides": list(args.overrides),
                     "detectable_rho": detectable_rho(n), "top_k": k, "wall_s": wall_s,
                     "spearman": {}, "spearman_ref": {}, "top_k_utility": {},
                     "top_k_utility_ref": {}}
    for target, key in (("utility", "spearman"), ("utility_ref", "spearman_ref")):
        u = [r[target] for r in rows]
        summary[f"mean_{target}"] = sum(u) / n
        for s in SCORES:
            x = [r[f"score_{s}"] for r in rows]
            summary[key][s] = rank_correlation(x, u).as_dict()
            summary[f"top_k_{target}"][s] = top_k_mean(x, u, k)
    pred = [r["sgd_predicted_ref"] for r in rows]
    real = [r["sgd_drop_ref"] for r in rows]
    summary["first_order"] = {**line_fit(pred, real), "eta": rows[0]["eta"] if rows else None,
                              "spearman": rank_correlation(pred, real).as_dict()}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
