"""report.md and figures of `compassplay experiment utility` (see `commands.utility_experiment`)."""

from __future__ import annotations

import json
from pathlib import Path

SCORE_TITLES = {"cos": "cosine", "inner": "inner product", "precond_cos": "preconditioned cosine",
                "difficulty": "difficulty (1 - s)", "novelty": "novelty",
                "cos_novelty": "cos x novelty", "random": "random",
                "heldout_cos": "positive control: cos with g_heldout"}
STEP_TITLES = {"sgd": "(a) plain gradient step", "dir": "(b) normalised direction step",
               "adamw": "(c) the run's AdamW (checkpoint moments)",
               "adamw_fresh": "extra: a fresh AdamW"}
END_TITLES = {"heldout": "held-out MATH gold solutions", "ref_b": "reference items not in g_ref"}


def _est(d: dict, holm: bool = False) -> str:
    txt = f"{d.get('rho', d.get('value')):+.2f} [{d['ci_low']:+.2f}, {d['ci_high']:+.2f}]"
    txt += f" p={d['p']:.2g}"
    if holm and "p_holm" in d:
        txt += f" (Holm {d['p_holm']:.2g})"
    return txt


def write_report(out: Path, summary: dict) -> Path:
    """Write DIR/report.md and DIR/scores_vs_utility.png."""
    rows = []
    for d in summary.get("dirs", [str(out)]):
        path = Path(d) / "candidates.jsonl"
        rows += [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    figure = _plot(out, rows)
    lines = ["# Does the cosine pick the tasks that teach?", "",
             f"{summary['n']} eligible candidates from pools {summary['pools']} (config "
             f"{summary['config']}), strata (pool/task type) {summary['strata']}. Each "
             "utility is the drop (nats/token, > 0 = helped) of a loss after one step on the "
             "candidate's verified solutions, from the same weights for every candidate "
             "(`commands/utility_measure.py`). rho: pooled Spearman; within: per stratum, Fisher-"
             "combined (strata under 5 left out); partial: within strata, given target length "
             "and gradient norm. [95% bootstrap], permutation p, Holm over "
             "cos, inner, preconditioned cos, difficulty, novelty, cos x novelty.", ""]
    for key, u in summary["utilities"].items():
        kind, rest = key.split("_", 1)
        step = "adamw_fresh" if rest.startswith("adamw_fresh") else rest.split("_", 1)[0]
        end = rest[len(step) + 1:]
        what = "realized drop" if kind == "drop" else "first-order drop -<delta, g_t>"
        lines += [f"## {STEP_TITLES.get(step, step)}: {END_TITLES.get(end, end)}, {what}", "",
                  f"n = {u['n']}, mean drop {u['mean']:+.3g}; the within-stratum design detects "
                  f"|rho| >= {u['detectable_within']:.2f} at power 0.8.", "",
                  "| score | pooled rho | within rho | partial rho |", "| --- | --- | --- | --- |"]
        for s, title in SCORE_TITLES.items():
            d = u["scores"][s]
            lines.append(f"| {title} | {_est(d['pooled'])} | {_est(d['within'], True)} | "
                         f"{_est(d['partial'], True)} |")
        pv = summary["precond_vs_plain"].get(key)
        if pv:
            lines += ["", f"Preconditioned minus plain cosine (within rho): {_est(pv)} "
                      "(p here: share of paired resamples <= 0)."]
        lines.append("")
    lines += ["## First-order checks (realized drop against -<delta, g_t>)", "",
              "| step / endpoint | slope | r | n |", "| --- | --- | --- | --- |"]
    for k, fo in summary["first_order"].items():
        lines.append(f"| {k} | {fo['slope']:.3f} | {fo['r']:.3f} | {fo['n']} |")
    if summary.get("momentum_drop"):
        lines += ["", "(c) with g = 0 (the checkpoint's momentum alone) drops "
                  + ", ".join(f"{k} by {v:+.3g}" for k, v in summary["momentum_drop"].items())
                  + ": a common offset of every candidate's (c) drop."]
    lines += ["", f"![Scores against utility]({figure})", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def _plot(out: Path, rows: list[dict]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [s for s in STEP_TITLES if any(r.get(f"drop_{s}_heldout") is not None for r in rows)]
    fig, axes = plt.subplots(1, max(1, len(steps)), figsize=(4 * max(1, len(steps)), 3.6),
                             squeeze=False)
    types = sorted({r["task_type"] for r in rows})
    for ax, s in zip(axes[0], steps, strict=False):
        for t in types:
            sub = [r for r in rows if r["task_type"] == t and r.get(f"drop_{s}_heldout")
                   is not None]
            ax.scatter([r["score_cos"] for r in sub], [r[f"drop_{s}_heldout"] for r in sub],
                       s=10, label=t)
        ax.set_xlabel("cos(g, g_ref)")
        ax.set_ylabel("held-out drop")
        ax.set_title(STEP_TITLES[s], fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "scores_vs_utility.png", dpi=90)
    plt.close(fig)
    return "scores_vs_utility.png"
