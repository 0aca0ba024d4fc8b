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
import time
from pathlib import Path

from compassplay.config import ConfigError, RunConfig, load_config

log = logging.getLogger(__name__)

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
    p.add_argument("--eta", type=float, default=1e-4, help="utility: size of the plain "
                   "gradient step (a) (SmolLM2-135M: at 1e-3 the second-order term, about "
                   "-3e-3 nats, swamps the first-order one, about 6e-4; at 1e-4 r = 0.96)")
    p.add_argument("--dir-length", type=float, default=None, help="utility: length of the "
                   "normalised direction step (b) (default: eta x the median gradient norm of "
                   "the pool's first 8 candidates)")
    p.add_argument("--lr", type=float, default=None, help="utility: learning rate of the "
                   "fresh AdamW step (default: the config's learner.lr; the checkpoint's own "
                   "AdamW step uses the checkpoint's)")
    p.add_argument("--checkpoint", default=None, help="utility: a run's checkpoint folder (or "
                   "run folder: its latest): measure at its weights, and step (c) continues its "
                   "AdamW moment state")
    p.add_argument("--ref-split", type=int, default=8, help="utility: g_ref from the "
                   "reference file's first N items (the run's reference.max_items), the "
                   "reference endpoint on the next N")
    p.add_argument("--realized", type=int, default=None, help="utility: measure the realized "
                   "drops of the first N candidates only (the first-order predictions of all; "
                   "default: realized for every candidate)")
    p.add_argument("--pool-from", default=None, help="utility: measure this pool.jsonl "
                   "(another experiment's) instead of collecting one")
    p.add_argument("--pool-name", default=None, help="utility: the pool's name in the rows "
                   "(default: the --out folder's name); a stratum of the analysis")
    p.add_argument("--also", nargs="*", default=[], metavar="DIR", help="utility: other "
                   "experiment folders whose candidates.jsonl join the analysis (independent "
                   "pools; each is its own stratum)")


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
    args.pool_name = args.pool_name or out.name
    if args.pool_from:
        pool = [json.loads(x) for x in Path(args.pool_from).read_text().splitlines() if x.strip()]
    else:
        pool = collect_pool(cfg, out / POOL_FILE, args.candidates, args.max_steps)
    if len(pool) < 3:
        log.error("only %d eligible candidates after %d steps: nothing to rank", len(pool),
                  args.max_steps)
        return 1
    from compassplay.commands.utility_measure import measure  # lazy: keeps the CLI start light

    measure(cfg, pool[:args.candidates], data, out, args, out / ROWS_FILE)
    summary = summarize([out, *map(Path, args.also)], out, base, args, time.time() - t0)
    from compassplay.commands.utility_report import write_report  # lazy: keeps the CLI start light

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
    from compassplay.executors.local import InProcess  # lazy: keeps the CLI start light
    from compassplay.step.graph import submit_step  # lazy: keeps the CLI start light
    from compassplay.workers.generator_workers import (  # lazy: keeps the CLI start light
        ProposerWorker,
        SolverWorker,
    )
    from compassplay.workers.scorer_worker import ScorerWorker  # lazy: keeps the CLI start light
    from compassplay.workers.verifier_worker import (
        VerifierWorker,  # lazy: keeps the CLI start light
    )

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
            tasks = {t.task_id: t for t in got["collect"].solved}
            rows = [{"step": step, **c.model_dump(mode="json"),
                     "task": tasks[c.task_id].model_dump(mode="json")}
                    for c in got["candidates"].cands]
            with path.open("a") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
            pool += rows
            log.info("pool step %d: %d proposals valid, %d eligible (%d/%d, %.0f s)", step,
                     sum(t.valid for t in got["collect"].tasks), len(rows),
                     len(pool), want, time.time() - t)
    finally:
        for v in workers["verifier"]:
            v.close()
    return pool


def read_rows(dirs: list[Path]) -> list[dict]:
    """The measured rows of experiment folders (each row names its pool)."""
    rows = []
    for d in dirs:
        path = d / ROWS_FILE
        if not path.is_file():
            raise ConfigError(f"{path} not found (a measured utility experiment folder holds it)")
        rows += [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return rows


def summarize(dirs: list[Path], out: Path, base: str, args: argparse.Namespace,
              wall_s: float) -> dict:
    """DIR/summary.json from the candidates.jsonl of `dirs` (see `utility_analysis`)."""
    from compassplay.commands.utility_analysis import analyse  # lazy: keeps the CLI start light

    summary = {"config": base, "overrides": list(args.overrides), "wall_s": wall_s,
               "dirs": [str(d) for d in dirs], **analyse(read_rows(dirs))}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
