"""report.md of `compassplay experiment selection` (see `commands.selection_experiment`)."""

from __future__ import annotations

from pathlib import Path

ARM_TITLES = {"cos": "cosine (the paper)", "precond_cos": "preconditioned cosine",
              "difficulty": "difficulty 1 - s (AZR)", "random": "random",
              "heldout_cos": "positive control: cos with g_heldout"}


def write_report(out: Path, summary: dict) -> Path:
    """Write OUT/report.md."""
    d = summary["design"]
    ends = list(next(iter(summary["arms"].values()), {}))
    lines = ["# Tasks selected by each reward, compared end to end", "",
             f"{d['candidates']} candidates in {d['subpools']} disjoint subpools; each arm "
             f"takes its top {d['top']} per subpool; the same solver trains on each arm's "
             "picks; drops of each endpoint's loss (nats/token, > 0 = helped), paired by "
             "subpool against the random arm.", "",
             f"Design (written before training): the paired mean difference has SD "
             f"{d['sd_of_paired_mean_difference']:.3g} under random selection of the measured "
             f"one-step utilities, so the minimum detectable effect at power 0.8 is "
             f"{d['mde_power_0.8']:.3g} nats/token (in one-step-utility units).", "",
             "| arm | " + " | ".join(f"mean drop {e}" for e in ends) + " |",
             "| --- |" + " --- |" * len(ends)]
    for arm, title in ARM_TITLES.items():
        lines.append(f"| {title} | " + " | ".join(f"{summary['arms'][arm][e]:+.3g}"
                                                 for e in ends) + " |")
    lines += ["", "Against random (paired over subpools: mean [95% t interval], sign-flip p, "
              "wins):", "", "| arm | " + " | ".join(ends) + " |", "| --- |" + " --- |" * len(ends)]
    for arm, per in summary["against_random"].items():
        cells = [f"{v['mean']:+.2g} [{v['ci_low']:+.2g}, {v['ci_high']:+.2g}] p={v['p']:.2g} "
                 f"{v['wins']}/{v['n']}" for v in (per[e] for e in ends)]
        lines.append(f"| {ARM_TITLES[arm]} | " + " | ".join(cells) + " |")
    lines += ["", ("The positive control beats random on the primary endpoint: the design can "
                   "see a selection effect of that size." if summary["sensitive"] else
                   "**The positive control does not beat random on the primary endpoint: the "
                   "design is insensitive here, and a null for the other arms says nothing.**"),
              ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
