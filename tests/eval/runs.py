"""Synthetic run dirs (config.yaml, metrics.jsonl, samples.jsonl) for the report tests."""

from __future__ import annotations

import json
import random
from pathlib import Path

from compassplay.eval.eval_records import CostMetric, EvalMetric


def make_run(root: Path, name: str, seed: int, reward: str, offset: float, steps: int = 8,
             benchmarks: tuple[str, ...] = ("cruxeval-o", "math500"), cost: bool = True,
             samples: bool = True, lean: bool = False, eval_every: int = 2) -> Path:
    """A run whose accuracy on every benchmark at step s is 0.3 + offset + 0.01 * s (+ seed
    noise of +-0.005), so final-quarter means are known in closed form."""
    d = root / f"{name}"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(f"run:\n  name: {name}\n  seed: {seed}\n"
                                   f"reward:\n  kind: {reward}\n")
    rng = random.Random(seed)
    lines, rows = [], []
    noise = 0.005 if seed % 2 else -0.005
    for s in range(steps + 1):
        if s > 0:
            step = {"step": s, "weight_version": s, "reward_distinct": 3 + s % 2,
                    "reward_mean": 0.1}
            if cost:
                step["cumulative_device_seconds"] = 360.0 * s
            if lean:
                step["coverage"] = 0.1 * s / steps + offset
                step["copy_rate"] = 0.5 - offset
                step["reference_loss"] = 2.0 - offset - 0.01 * s
            lines.append(step)
            if samples:
                for i in range(4):
                    rows.append({"step": s, "task_id": f"{s}-{i}", "valid": i != 3,
                                 "solve_rate": 0.5, "reward": round(rng.random(), 3)})
        if s % eval_every == 0:
            for b in benchmarks:
                acc = 0.3 + offset + 0.01 * s + noise
                lines.append(EvalMetric(step=s, version=s, benchmark=b, accuracy=acc,
                                        n=100).model_dump())
    if cost:
        lines.append(CostMetric(step=steps, cumulative_device_seconds=360.0 * steps).model_dump())
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    if samples:
        (d / "samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    return d
