"""Plot a run's metrics.jsonl to one PNG (reward, solve rate, validity, loss, stage seconds),
and a Lean run's fleet timeline (lean_fleet.jsonl) to another."""

from __future__ import annotations

from pathlib import Path

from compassplay.eval.eval_records import STEP_KIND, line_kind
from compassplay.rundir.runlog import LEAN_FLEET_FILE, METRICS_FILE, read_metrics


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


def read_lean_timeline(path: str | Path) -> list[dict]:
    """The rows of a run's lean_fleet.jsonl (LeanFleetActor.take_timeline); ValueError naming
    the file and line for a line that is not a JSON object with `unix`, `backlog`, `actors`."""
    import json

    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            float(row["unix"]), int(row["backlog"]), int(row["actors"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{i}: not a Lean fleet timeline row ({exc})") from None
        rows.append(row)
    return rows


def plot_lean_fleet(run_dir: str | Path, out: str | Path | None = None) -> Path | None:
    """RUN_DIR/lean_fleet.png from lean_fleet.jsonl, against seconds since its first row:
    backlog, actors (asked for; placed and started), alive nodes per type, and each actor's
    seconds from demand to start at its start. None when the run has no Lean fleet timeline."""
    run_dir = Path(run_dir)
    path = run_dir / LEAN_FLEET_FILE
    if not path.exists():
        return None
    rows = read_lean_timeline(path)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = rows[0]["unix"]
    ts = [r["unix"] - t0 for r in rows]
    fig, (top, mid, nod, low) = plt.subplots(4, 1, figsize=(10, 10), sharex=True)
    top.step(ts, [r["backlog"] for r in rows], where="post", label="backlog (checks)")
    top.set_title("Lean checks submitted, not finished")
    mid.step(ts, [r["actors"] for r in rows], where="post", label="asked for")
    mid.step(ts, [r.get("placed", r["actors"]) for r in rows], where="post",
             label="placed and started")
    mid.set_title("LeanVerifier actors")
    for kind in sorted({k for r in rows for k in r.get("nodes", {})}):
        nod.step(ts, [r.get("nodes", {}).get(kind, 0) for r in rows], where="post", label=kind)
    nod.set_title("alive nodes per type")
    waits = [(t, w) for t, r in zip(ts, rows, strict=True) for w in r.get("start_waits", [])]
    low.plot([t for t, _ in waits], [w for _, w in waits], "o", label="demand -> started (s)")
    low.set_title("seconds from an actor's demand to its start (at its start)")
    low.set_xlabel("seconds since the fleet's first row")
    for ax in (top, mid, nod, low):
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(f"{run_dir.name}: Lean fleet")
    fig.tight_layout()
    out = Path(out) if out else run_dir / "lean_fleet.png"
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
