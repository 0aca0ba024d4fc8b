"""Plot a run's metrics.jsonl to one PNG (reward, solve rate, validity, loss, stage seconds)."""

from __future__ import annotations

from pathlib import Path

from compassplay.eval.eval_records import STEP_KIND, line_kind
from compassplay.run.runlog import METRICS_FILE, read_metrics


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write `out` (default RUN_DIR/metrics.png) and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = [r for r in read_metrics(run_dir / METRICS_FILE) if line_kind(r) == STEP_KIND]
    if not rows:
        raise ValueError(f"{run_dir / METRICS_FILE} has no steps to plot")
    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(2, 3, figsize=(14, 7))
    panels = [
        ("proposer reward", [("mean", "reward_mean"), ("std", "reward_std")]),
        ("solver", [("solve rate (proposed)", "solve_rate_mean"),
                    ("accuracy (all attempts)", "solver_accuracy")]),
        ("proposals", [("proposals", "proposals"), ("valid", "valid"), ("eligible", "eligible")]),
        ("learner", [("loss", "loss"), ("grad norm", "grad_norm")]),
        ("reward signal", [("distinct eligible rewards", "reward_distinct"),
                           ("score's share of proposer advantage variance",
                            "score_advantage_share")]),
    ]
    for ax, (title, series) in zip(axes.flat, panels, strict=False):
        for label, key in series:
            ax.plot(steps, [r.get(key) if r.get(key) is not None else float("nan")
                            for r in rows], marker=".", label=label)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend()
    ax = axes.flat[5]
    stages = sorted({k for r in rows for k in r["stage_seconds"]})
    bottom = [0.0] * len(rows)
    for st in stages:
        vals = [r["stage_seconds"].get(st, 0.0) for r in rows]
        ax.bar(steps, vals, bottom=bottom, label=st)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_title("seconds per stage")
    ax.set_xlabel("step")
    ax.legend()
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    out = Path(out) if out else run_dir / "metrics.png"
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
