"""What a person sees when a run ends: a per-step table, run totals, failure reasons, files.

`run_summary(run_dir)` reads metrics.jsonl and returns the figures (a dict, also what
`compassplay bench run` reports); `format_summary` renders them as a short text table.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from compassplay.rundir.runlog import METRICS_FILE, SAMPLES_FILE, read_metrics

COLUMNS = [("step", "step", "{:d}"), ("valid", "valid", "{}"), ("elig", "eligible", "{:d}"),
           ("solve", "solve_rate_mean", "{:.2f}"), ("acc", "solver_accuracy", "{:.2f}"),
           ("reward", "reward_mean", "{:+.3f}"), ("share", "score_advantage_share", "{:.0%}"),
           ("loss", "loss", "{:+.4f}"), ("sec", "step_seconds", "{:.0f}"),
           ("wall", "wall_seconds", "{:.0f}")]
"""Columns of the per-step table: (header, metrics.jsonl key, format). `share`: the part of
the proposer's advantage variance the reward's score decides (docs/reward.md); `sec`: the
stages' own seconds; `wall`: from the previous step's result to this one's (the stages plus
taking weights and moving payloads between workers)."""


def run_summary(run_dir: str | Path) -> dict:
    """Figures of the run in `run_dir`: per step and over the run. Proposals valid, eligible
    candidates (0 < s < 1 with a verified solution), solver accuracy over all attempts, the
    parse failures and invalid reasons summed over steps, and the run's wall seconds."""
    rows = read_metrics(Path(run_dir) / METRICS_FILE)
    proposals = sum(r["proposals"] for r in rows)
    valid = sum(r["valid"] for r in rows)
    parse: Counter[str] = Counter()
    invalid: Counter[str] = Counter()
    for r in rows:
        parse.update(r.get("parse_failures", {}))
        invalid.update(r.get("invalid_reasons", {}))
    n = max(len(rows), 1)
    return {
        "steps": len(rows),
        "proposals": proposals,
        "valid": valid,
        "valid_rate": valid / proposals if proposals else 0.0,
        "eligible_per_step": sum(r["eligible"] for r in rows) / n,
        "steps_with_eligible": sum(r["eligible"] > 0 for r in rows),
        "solver_accuracy": sum(r["solver_accuracy"] for r in rows) / n,
        "reward_mean": sum(r["reward_mean"] for r in rows) / n,
        # wall seconds from the first step's start to the last step's end (steps overlap
        # when pipeline.staleness > 0, so their seconds do not add up)
        "seconds": (max(r.get("step_end", 0.0) for r in rows)
                    - min(r.get("step_start", 0.0) for r in rows)) if rows else 0.0,
        "parse_failures": dict(parse.most_common()),
        "invalid_reasons": dict(invalid.most_common()),
        "per_step": [{k: r.get(k) for _, k, _ in COLUMNS} | {"proposals": r["proposals"]}
                     for r in rows],
    }


def format_summary(summary: dict, run_dir: str | Path, plot: Path | None = None) -> str:
    """The summary as a few lines of text: table, totals, reasons, where the files are."""
    lines = ["  ".join(f"{h:>7}" for h, _, _ in COLUMNS)]
    for row in summary["per_step"]:
        cells = []
        for _, key, fmt in COLUMNS:
            v = row.get(key)
            if key == "valid":
                v = f"{v}/{row['proposals']}"
            cells.append(f"{fmt.format(v) if v is not None else '-':>7}")
        lines.append("  ".join(cells))
    s = summary
    lines.append(f"valid proposals {s['valid']}/{s['proposals']} ({s['valid_rate']:.0%}), "
                 f"eligible per step {s['eligible_per_step']:.1f} "
                 f"({s['steps_with_eligible']}/{s['steps']} steps with some), solver accuracy "
                 f"{s['solver_accuracy']:.0%}, {s['seconds']:.0f} s from first step to last")
    for title, key in (("parse failures", "parse_failures"), ("invalid", "invalid_reasons")):
        if s[key]:
            lines.append(f"{title}: " + ", ".join(f"{k} {v}" for k, v in s[key].items()))
    run_dir = Path(run_dir)
    files = [run_dir / METRICS_FILE, run_dir / SAMPLES_FILE, run_dir / "summary.json"] + (
        [plot] if plot else [])
    lines.append("results: " + ", ".join(str(f) for f in files if f.exists()))
    model = final_model(run_dir)
    if model is not None:
        lines.append(f"final model (HF folder: from_pretrained, vllm, `compassplay eval "
                     f"--model`): {model}")
    return "\n".join(lines)


def final_model(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint's model/ folder (None when the run has none)."""
    from compassplay.rundir.checkpoint import MODEL_DIR, latest_checkpoint  # lazy: pulls torch

    ckpt = latest_checkpoint(run_dir)
    return ckpt / MODEL_DIR if ckpt is not None and (ckpt / MODEL_DIR).is_dir() else None
