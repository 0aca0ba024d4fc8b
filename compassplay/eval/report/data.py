"""Runs read back for `compassplay report`: what each run logged, grouped into arms.

A run dir holds config.yaml and metrics.jsonl (see `compassplay.eval.eval_records` for its line
kinds), and optionally samples.jsonl (one row per proposal with its reward). Runs are grouped
into arms by the config's `run.name` with a trailing seed suffix removed (`cos-seed1`,
`cos_seed2`, `cos-s3`, `cos-seed-4` -> `cos`), or, with `--group-by reward`, by `reward.kind`.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from compassplay.config import RewardSection
from compassplay.eval.eval_records import COST_FIELD, COST_KIND, EVAL_KIND, STEP_KIND, line_kind

SEED_SUFFIX = re.compile(r"([-_.](seed[-_]?|s)|seed)\d+$")
FINAL_FRACTION = 0.25


def arm_name(run_name: str) -> str:
    return SEED_SUFFIX.sub("", run_name) or run_name


@dataclass
class Run:
    """One run's logged data. `evals[benchmark]` = [(step, accuracy)] sorted by step;
    `cost[step]` = cumulative device seconds; `rewards[step]` = eligible candidates' rewards."""

    path: Path
    name: str
    reward_kind: str
    seed: int | None
    reward_rules: str = "?"
    steps: list[dict] = field(default_factory=list)
    evals: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    cost: dict[int, float] = field(default_factory=dict)
    rewards: dict[int, list[float]] = field(default_factory=dict)

    @property
    def final_step(self) -> int:
        steps = [r["step"] for r in self.steps] + [s for v in self.evals.values() for s, _ in v]
        return max(steps, default=0)

    def window_start(self) -> float:
        """First step of the final quarter of training."""
        return (1.0 - FINAL_FRACTION) * self.final_step

    def final_quarter(self, benchmark: str) -> float | None:
        """Mean accuracy over the evaluations in the final quarter of training."""
        start = self.window_start()
        vals = [a for s, a in self.evals.get(benchmark, []) if s >= start]
        return sum(vals) / len(vals) if vals else None

    def series(self, key: str) -> list[tuple[int, float]]:
        """(step, value) of a numeric step-line field, where present."""
        return [(r["step"], float(r[key])) for r in self.steps
                if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]


def _eligible(row: dict) -> bool:
    """samples.jsonl rows: "eligible" when logged, else valid with a solve rate in (0, 1)."""
    if "eligible" in row:
        return bool(row["eligible"])
    s = row.get("solve_rate")
    return bool(row.get("valid")) and s is not None and 0.0 < s < 1.0


def reward_rules(reward_cfg: dict) -> str:
    """How a run's proposer rewards were set outside the eligible reward and turned into
    advantages (reward.normalize; unparsed / ill-posed / ineligible rewards), from its
    config.yaml `reward` section (older configs read as they ran); '?' when unreadable."""
    if not reward_cfg:
        return "?"
    try:
        r = RewardSection.model_validate(reward_cfg)
    except ValueError:
        return "?"
    return (f"normalize={r.normalize}; unparsed {r.format_penalty:g}, ill-posed "
            f"{r.invalid_penalty:g}, ineligible {r.ineligible_reward:g}")


def load_run(path: str | Path) -> Run:
    path = Path(path)
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise FileNotFoundError(f"{path}: no metrics.jsonl (not a run dir?)")
    cfg = {}
    if (path / "config.yaml").is_file():
        cfg = yaml.safe_load((path / "config.yaml").read_text()) or {}
    run_cfg, reward_cfg = cfg.get("run") or {}, cfg.get("reward") or {}
    run = Run(path=path, name=str(run_cfg.get("name") or path.name),
              reward_kind=str(reward_cfg.get("kind", "?")),
              seed=run_cfg.get("seed"), reward_rules=reward_rules(reward_cfg))
    evals: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for line in metrics.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        kind = line_kind(row)
        if kind == EVAL_KIND and "benchmark" in row and "accuracy" in row:
            evals[row["benchmark"]].append((int(row.get("step", 0)), float(row["accuracy"])))
        elif kind == COST_KIND and COST_FIELD in row:
            run.cost[int(row["step"])] = float(row[COST_FIELD])
        elif kind == STEP_KIND and "step" in row:
            run.steps.append(row)
            if isinstance(row.get(COST_FIELD), (int, float)):
                run.cost[int(row["step"])] = float(row[COST_FIELD])
    run.evals = {b: sorted(v) for b, v in evals.items()}
    samples = path / "samples.jsonl"
    if samples.is_file():
        for line in samples.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if _eligible(row) and isinstance(row.get("reward"), (int, float)):
                    run.rewards.setdefault(int(row.get("step", 0)), []).append(
                        float(row["reward"]))
    return run


def group_runs(runs: list[Run], by: str = "name") -> dict[str, list[Run]]:
    """Arms in first-seen order: by run name minus its seed suffix, or by reward.kind."""
    arms: dict[str, list[Run]] = {}
    for r in runs:
        key = arm_name(r.name) if by == "name" else r.reward_kind
        arms.setdefault(key, []).append(r)
    return arms


@dataclass(frozen=True)
class Stat:
    """Mean over seeds, sample s.d. (None with one seed), number of seeds."""

    mean: float
    sd: float | None
    n: int


def stat(values: list[float]) -> Stat | None:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return None
    return Stat(sum(vals) / len(vals), statistics.stdev(vals) if len(vals) > 1 else None,
                len(vals))


def cost_at(run: Run, step: int) -> float | None:
    """Cumulative device seconds at `step` (the last known value at or before it; 0 at step
    0, before any training, when nothing was logged there)."""
    known = [s for s in run.cost if s <= step]
    if known:
        return run.cost[max(known)]
    return 0.0 if step == 0 and run.cost else None
