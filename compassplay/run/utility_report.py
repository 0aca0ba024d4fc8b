"""report.md and figures of `compassplay experiment utility` (see `run.utility_experiment`)."""

from __future__ import annotations

import json
from pathlib import Path

SCORE_TITLES = {"cos": "cosine", "inner": "inner product", "difficulty": "difficulty (1 - s)",
                "novelty": "novelty", "cos_novelty": "cos x novelty", "random": "random"}


def _rho(d: dict) -> str:
    return f"{d['rho']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] p={d['p']:.3g}"


def write_report(out: Path, summary: dict) -> Path:
    """Write DIR/report.md, DIR/scores_vs_utility.png and DIR/first_order.png."""
    rows = [json.loads(x) for x in (out / "candidates.jsonl").read_text().splitlines()
            if x.strip()]
    figures = _plots(out, rows)
    fo = summary["first_order"]
    lines = [
        "# Does the cosine pick the tasks that teach?", "",
        f"{summary['n']} eligible candidates (config {summary['config']}"
        + (f", overrides {' '.join(summary['overrides'])}" if summary["overrides"] else "")
        + f"), {summary['wall_s']:.0f} s. Utility = drop of the held-out math loss "
        "(nats/token) after one step of the learner's optimizer on the candidate's verified "
        "solution, from the same weights for every candidate; utility_ref = the same for the "
        "reference loss.", "",
        f"Power: with {summary['n']} candidates a two-sided test at 0.05 detects |rho| >= "
        f"{summary['detectable_rho']:.2f} with 80% power; a smaller true correlation can be "
        "missed, so a null result here does not show its absence.", "",
        "| Score | rho with utility (95% CI, perm. p) | rho with utility_ref | "
        f"top-{summary['top_k']} mean utility | top-{summary['top_k']} mean utility_ref |",
        "| --- | --- | --- | --- | --- |"]
    for s, title in SCORE_TITLES.items():
        lines.append(f"| {title} | {_rho(summary['spearman'][s])} | "
                     f"{_rho(summary['spearman_ref'][s])} | "
                     f"{summary['top_k_utility'][s]:+.5f} | "
                     f"{summary['top_k_utility_ref'][s]:+.5f} |")
    lines += ["", f"Mean utility over all candidates: {summary['mean_utility']:+.5f} "
              f"(held-out), {summary['mean_utility_ref']:+.5f} (reference).", "",
              "## First-order check", "",
              f"Plain SGD step of eta = {fo['eta']}: realized reference-loss drop against "
              f"eta * <g, g_ref>: slope {fo['slope']:.3f}, intercept {fo['intercept']:+.2e}, "
              f"r = {fo['r']:.3f} (r^2 {fo['r2']:.3f}), Spearman {_rho(fo['spearman'])}. "
              "Slope 1 and r near 1 mean the first-order picture holds at this step size.", ""]
    for title, name in figures:
        lines += [f"![{title}]({name})", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def _plots(out: Path, rows: list[dict]) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(12, 7))
    u = [r["utility"] for r in rows]
    for ax, (s, title) in zip(axes.flat, SCORE_TITLES.items(), strict=True):
        ax.scatter([r[f"score_{s}"] for r in rows], u, s=12)
        ax.set_xlabel(title)
        ax.set_ylabel("held-out loss drop")
    fig.tight_layout()
    fig.savefig(out / "scores_vs_utility.png", dpi=90)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 4))
    pred = [r["sgd_predicted_ref"] for r in rows]
    ax.scatter(pred, [r["sgd_drop_ref"] for r in rows], s=12)
    lo, hi = min(pred, default=0.0), max(pred, default=0.0)
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="realized = predicted")
    ax.set_xlabel("eta * <g, g_ref>")
    ax.set_ylabel("realized reference-loss drop")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "first_order.png", dpi=90)
    plt.close(fig)
    return [("Scores against utility", "scores_vs_utility.png"),
            ("First-order check", "first_order.png")]
