"""`compassplay bench run`: the default run's figures as one JSON object.

Runs `--config` (default: the shipped default job, Ray executor) with any dotted overrides and
reports its wall seconds (model preparation and the format bootstrap included) with the run
summary (`commands.summary.run_summary`: valid rate, eligible per step, solver accuracy, parse
failures, per-step rows). `--run-dir DIR` reports an existing run instead (no wall time).

    compassplay bench run --json run.seed=1 run.name=seed1
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from compassplay.commands.summary import run_summary
from compassplay.config import load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench run`."""
    parser.add_argument("--config", default="default", help="shipped name or YAML path")
    parser.add_argument("--run-dir", default="", help="summarize this finished run instead")
    parser.add_argument("--executor", default="ray", choices=["ray", "local"])
    parser.add_argument("overrides", nargs="*", help="dotted KEY=VALUE overrides")
    parser.add_argument("--json", action="store_true", help="print only the JSON object")


def run(args: argparse.Namespace) -> dict:
    """Run (or read) the run; returns the JSON-ready figures."""
    if args.run_dir:
        return {"run_dir": args.run_dir, "wall_s": None, **run_summary(Path(args.run_dir))}
    from compassplay.commands.launch import launch_run  # lazy: pulls torch

    cfg = load_config(args.config, args.overrides)
    t0 = time.perf_counter()
    run_dir = launch_run(cfg, executor=args.executor)
    wall = time.perf_counter() - t0
    return {"run_dir": str(run_dir), "config": args.config, "overrides": args.overrides,
            "seed": cfg.run.seed, "wall_s": round(wall, 1), **run_summary(run_dir)}
