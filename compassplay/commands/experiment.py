"""`compassplay experiment NAME`: a small controlled comparison, every arm x seed, then a report.

Each experiment is a shipped base config plus overrides shared by every arm (`common`) and
per arm (`arms`); arms differ only in the proposer reward. Every (arm, seed) is one
`compassplay run --executor local` in a subprocess (one CPU process, so seeds and arms cost
the same and a crash of one run loses only that run), written to `OUT/runs/ARM-seedS` with its
output in `OUT/logs/`; a run whose `summary.json` exists is kept, so re-running the command
continues an interrupted experiment. Then `compassplay report` groups the runs by arm (the
seed suffix removed) into `OUT/report/` and `OUT/experiment.json` records the commands, each
run's status and wall time.

Experiments (the paper's two comparisons, at a size a 2-core CPU runs):
- `external-reference` (coding): difficulty (AZR) vs cosine vs the cosine in the learner's
  AdamW metric (`precond_cosine`) vs SOAR, the reference set's
  loss (`logging.reference_loss`) and held-out accuracy (`eval`) against step and compute,
  and the distinct reward values among eligible candidates per batch.
- `local-reference` (coding, `reward.reference=local`: each candidate's reference gradient is
  that of its seed's verified solution): plain cosine vs cosine x novelty vs novelty only,
  with copy and rename rates per step (does the copy shortcut appear; does novelty close it).

    compassplay experiment external-reference --out exp/ext [--seeds 0 1 2] [--steps 12]
        [--data-dir ../shared/data] [--base micro_warm] [--dry-run] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from compassplay.commands import selection_experiment, utility_experiment
from compassplay.commands.selection_experiment import run_selection
from compassplay.commands.utility_experiment import run_utility
from compassplay.config import load_config
from compassplay.eval.benchmarks import find_data
from compassplay.eval.report import build_report

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Experiment:
    """`base` config, overrides for every arm, overrides per arm, the arm gains are taken
    against, and what the comparison asks."""

    base: str
    common: tuple[str, ...]
    arms: dict[str, tuple[str, ...]]
    baseline: str
    question: str


_SHARED = ("logging.reference_loss=true", "logging.progress=false", "eval.limit=20")
EXPERIMENTS = {
    "external-reference": Experiment(
        base="micro_warm", common=_SHARED,
        arms={"difficulty": ("reward.kind=difficulty",), "cosine": ("reward.kind=cosine",),
              "precond_cosine": ("reward.kind=precond_cosine",),
              "soar": ("reward.kind=soar",)},
        baseline="difficulty",
        question="with an external reference set, does cosine (plain, or in the learner's "
                 "AdamW metric) move the reference loss and held-out accuracy more than "
                 "difficulty per step and per CPU-second, and how does SOAR's cost compare?"),
    "local-reference": Experiment(
        base="micro_warm", common=(*_SHARED, "reward.reference=local"),
        arms={"cosine": ("reward.kind=cosine",), "cos_novelty": ("reward.kind=cos_novelty",),
              "novelty": ("reward.kind=novelty",)},
        baseline="cosine",
        question="with the seed's verified solution as the reference, does plain cosine learn "
                 "to copy its seed (copy and rename rates rise), and does the novelty factor "
                 "close that shortcut?"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=sorted([*EXPERIMENTS, "utility", "selection"]),
                   help="a comparison of arms (full RL runs), 'utility' (does the cosine rank "
                        "candidates by how much a step on them teaches; "
                        "`commands.utility_experiment`) or 'selection' (what the tasks each reward "
                        "selects teach a solver; `commands.selection_experiment`)")
    p.add_argument("--out", required=True, help="experiment folder (runs/, logs/, report/)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=12, help="self-play steps per run")
    p.add_argument("--eval-every", type=int, default=4, help="held-out evaluation every k "
                   "steps (0 = none)")
    p.add_argument("--data-dir", default="", help="benchmark data (cruxeval-o is evaluated "
                   "when its file is there; otherwise the packaged humaneval)")
    p.add_argument("--base", default=None, help="base config instead of the experiment's")
    p.add_argument("--run-timeout-s", type=float, default=3600.0,
                   help="a run still going after this many seconds is stopped and reported")
    p.add_argument("--dry-run", action="store_true", help="validate every arm's config and "
                   "print the commands; run nothing")
    p.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[],
                   metavar="KEY=VALUE", help="config overrides applied to every arm")
    utility_experiment.add_arguments(p)
    selection_experiment.add_arguments(p)


def held_out_benchmark(data_dir: str) -> str:
    """cruxeval-o when its data file is in `data_dir`, else the packaged humaneval."""
    return "cruxeval-o" if data_dir and find_data("cruxeval-o", data_dir)[0] else "humaneval"


def run_plan(args: argparse.Namespace) -> list[tuple[str, int, list[str]]]:
    """(arm, seed, `compassplay run` overrides) for every run, arms in definition order."""
    exp = EXPERIMENTS[args.name]
    bench = held_out_benchmark(args.data_dir)
    shared = [*exp.common, f"pipeline.steps={args.steps}",
              f"run.output_dir={Path(args.out) / 'runs'}", f"eval.every_steps={args.eval_every}",
              f"eval.benchmarks=[{bench}]", *([f"eval.data_dir={args.data_dir}"]
                                                if args.data_dir else [])]
    return [(arm, seed, [*shared, *extra, f"run.name={arm}-seed{seed}", f"run.seed={seed}",
                         *args.overrides])
            for arm, extra in exp.arms.items() for seed in args.seeds]


def rerun_command(args: argparse.Namespace) -> str:
    """The command that reruns (or continues) this experiment."""
    parts = ["compassplay experiment", args.name, "--out", str(args.out), "--seeds",
             *map(str, args.seeds), "--steps", str(args.steps), "--eval-every",
             str(args.eval_every)]
    parts += ["--data-dir", args.data_dir] if args.data_dir else []
    parts += ["--base", args.base] if args.base else []
    parts += ["--set", *args.overrides] if args.overrides else []
    return " ".join(parts)


def findings(args: argparse.Namespace, exp: Experiment, record: dict, summary: dict,
             planned: int) -> list[str]:
    """The experiment's section of report.md: the question, how to rerun it, and each arm
    against the baseline on every logged curve and held-out mean, as measured."""
    ok = sum(r["status"] in ("ok", "kept") for r in record["runs"])
    lines = ["", "## Experiment", "", f"Question: {exp.question}", "",
             f"Rerun or continue: `{rerun_command(args)}` ({ok} of {planned} runs finished, "
             f"{record['wall_s']:.0f} s this call; each run's command and wall time in "
             "experiment.json).", ""]
    base = summary.get("baseline")
    if base is None:
        return lines + ["No baseline run finished: no comparison.", ""]
    lines += [f"Each arm minus {base}, paired by seed (final-quarter values; mean, 95% "
              "bootstrap interval over seeds, sign-flip p and the smallest p the number of "
              "seeds allows, which bounds what this experiment can detect):", ""]
    for arm, metrics in summary.get("paired", {}).items():
        parts = [f"{k}: {_paired_text(v)}" for k, v in metrics.items()]
        lines.append(f"- {arm}: " + ("; ".join(parts) if parts else "nothing logged in common"))
    return lines + [""]


def _paired_text(d: dict) -> str:
    return (f"{d['mean']:+.4f} [{d['ci_low']:+.4f}, {d['ci_high']:+.4f}], p={d['p']:.3g} "
            f"(n={d['n']}, min p {d['min_p']:.3g})")


def _earlier_runs(path: Path) -> dict[tuple[str, int], dict]:
    """(arm, seed) -> the run's entry in an earlier experiment.json ({} when there is none)."""
    try:
        runs = json.loads(path.read_text())["runs"]
    except (OSError, ValueError, KeyError):
        return {}
    return {(r["arm"], r["seed"]): r for r in runs if "arm" in r and "seed" in r}


def _run_one(base: str, overrides: list[str], log_path: Path, timeout_s: float) -> str:
    """One run in a subprocess, its output to `log_path`; 'ok', 'failed (exit N)', 'timeout'."""
    # a run directory without summary.json is an interrupted run of this arm: start it again
    cmd = [sys.executable, "-m", "compassplay.cli", "run", "--executor", "local", "--overwrite",
           "--config", base, *overrides]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as out:
        out.write(" ".join(cmd) + "\n")
        out.flush()
        try:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT,
                                timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            return "timeout"
    return "ok" if rc == 0 else f"failed (exit {rc})"


def run(args: argparse.Namespace) -> int:
    if args.name == "utility":
        return run_utility(args)
    if args.name == "selection":
        return run_selection(args)
    exp = EXPERIMENTS[args.name]
    base = args.base or exp.base
    plan = run_plan(args)
    for _, _, overrides in plan:  # every arm's config must load before anything runs
        load_config(base, overrides)
    out = Path(args.out)
    if args.dry_run:
        for arm, seed, overrides in plan:
            print(f"{arm} seed {seed}: compassplay run --executor local --config {base} "
                  + " ".join(overrides))
        return 0
    record: dict = {"experiment": args.name, "question": exp.question, "base": base,
                    "baseline": exp.baseline, "runs": []}
    earlier = _earlier_runs(out / "experiment.json")  # kept runs keep their wall time
    t0 = time.time()
    for k, (arm, seed, overrides) in enumerate(plan, start=1):
        run_dir = out / "runs" / f"{arm}-seed{seed}"
        if (run_dir / "summary.json").is_file():
            log.info("[%d/%d] %s seed %d: done before, kept (%s)", k, len(plan), arm, seed,
                     run_dir)
            before = earlier.get((arm, seed), {})
            record["runs"].append({**before, "arm": arm, "seed": seed, "status": "kept",
                                   "dir": str(run_dir)})
            continue
        log_path = out / "logs" / f"{arm}-seed{seed}.log"
        log.info("[%d/%d] %s seed %d: running (output: %s; stops after %.0f s)", k, len(plan),
                 arm, seed, log_path, args.run_timeout_s)
        started = time.time()
        status = _run_one(base, overrides, log_path, args.run_timeout_s)
        wall = time.time() - started
        log.info("[%d/%d] %s seed %d: %s in %.0f s (%.0f s so far)", k, len(plan), arm, seed,
                 status, wall, time.time() - t0)
        record["runs"].append({"arm": arm, "seed": seed, "status": status, "wall_s": wall,
                               "dir": str(run_dir), "log": str(log_path),
                               "command": f"compassplay run --executor local --config {base} "
                                          + " ".join(overrides)})
    record["wall_s"] = time.time() - t0
    done = [r["dir"] for r in record["runs"] if r["status"] in ("ok", "kept")]
    (out / "experiment.json").write_text(json.dumps(record, indent=1) + "\n")
    if not done:
        print(f"error: no run of {args.name} finished; see {out / 'logs'}", file=sys.stderr)
        return 1
    baseline = exp.baseline if any(r["arm"] == exp.baseline and r["dir"] in done
                                   for r in record["runs"]) else None
    report = build_report(done, out / "report", baseline)
    summary = json.loads((out / "report" / "summary.json").read_text())
    with report.open("a") as fh:
        fh.write("\n".join(findings(args, exp, record, summary, len(plan))) + "\n")
    print(f"experiment {args.name}: {len(done)}/{len(plan)} runs, {record['wall_s']:.0f} s; "
          f"report: {report}")
    return 0 if len(done) == len(plan) else 1
