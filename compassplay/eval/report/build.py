"""The report's tables, sections and files (`build_report`) and its CLI entry (`run`); what it
writes: the package docstring."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from compassplay.eval.benchmarks import BENCHMARKS
from compassplay.eval.eval_records import CURVE_FIELDS
from compassplay.eval.paired import paired_diff
from compassplay.eval.report.data import FINAL_FRACTION, Run, Stat, group_runs, load_run, stat

DOMAIN_TITLES = {"code": "In-domain coding accuracy (%)",
                 "math": "Out-of-domain mathematics accuracy (%)", "other": "Other (%)"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--baseline", default=None, help="arm to compute gains against")
    p.add_argument("--group-by", choices=["name", "reward"], default="name",
                   help="arm = run name minus seed suffix (name) or reward.kind (reward)")
    p.add_argument("--out", required=True, help="output folder")


def domains_of(benchmarks: list[str]) -> dict[str, list[str]]:
    """Benchmarks split by domain, in registry order (unknown names go to 'other')."""
    order = list(BENCHMARKS)
    out: dict[str, list[str]] = {"code": [], "math": [], "other": []}
    for b in sorted(benchmarks, key=lambda x: (order.index(x) if x in order else len(order), x)):
        out[BENCHMARKS[b].domain if b in BENCHMARKS else "other"].append(b)
    return out


def arm_scores(runs: list[Run], bs: list[str]) -> dict[str, Stat | None]:
    """Per benchmark (and "Mean") the final-quarter score across the arm's runs."""
    out: dict[str, Stat | None] = {}
    for b in bs:
        out[b] = stat([v for v in (r.final_quarter(b) for r in runs) if v is not None])
    means = []
    for r in runs:
        vals = [r.final_quarter(b) for b in bs]
        if vals and all(v is not None for v in vals):
            means.append(sum(vals) / len(vals))
    out["Mean"] = stat(means)
    return out


def base_scores(runs: list[Run], bs: list[str]) -> dict[str, Stat | None]:
    """Step-0 evaluations (the model before training), pooled over all runs."""
    out: dict[str, Stat | None] = {}
    for b in bs:
        out[b] = stat([a for r in runs for s, a in r.evals.get(b, []) if s == 0])
    full = [o.mean for o in out.values() if o is not None]
    out["Mean"] = stat([sum(full) / len(full)]) if full and len(full) == len(bs) else None
    return out


def _cell(s: Stat | None) -> str:
    if s is None:
        return "-"
    return f"{100 * s.mean:.2f}" + (f" ±{100 * s.sd:.2f}" if s.sd is not None else "")


def table(arms: dict[str, list[Run]], bs: list[str], baseline: str | None,
          title: str) -> tuple[list[str], dict]:
    """Markdown lines and the numbers of one domain table."""
    cols = bs + ["Mean"]
    lines = [f"### {title}", "", "| Method | " + " | ".join(cols) + " |",
             "| --- |" + " --- |" * len(cols)]
    numbers: dict = {}
    all_runs = [r for rs in arms.values() for r in rs]
    base = base_scores(all_runs, bs)
    if any(v is not None for v in base.values()):
        lines.append("| Base model (step 0) | " + " | ".join(_cell(base[c]) for c in cols) + " |")
        numbers["Base model"] = {c: base[c].mean if base[c] else None for c in cols}
    scores = {arm: arm_scores(runs, bs) for arm, runs in arms.items()}
    for arm, sc in scores.items():
        n = len(arms[arm])
        lines.append(f"| {arm} ({n} run{'s' if n > 1 else ''}) | "
                     + " | ".join(_cell(sc[c]) for c in cols) + " |")
        numbers[arm] = {c: ({"mean": sc[c].mean, "sd": sc[c].sd, "n": sc[c].n} if sc[c] else None)
                        for c in cols}
    if baseline in scores:
        for arm, sc in scores.items():
            if arm == baseline:
                continue
            gains = []
            for c in cols:
                a, b = sc[c], scores[baseline][c]
                gains.append(f"{100 * (a.mean - b.mean):+.2f}" if a and b else "-")
            lines.append(f"| Gain of {arm} over {baseline} | " + " | ".join(gains) + " |")
            numbers[f"gain:{arm}"] = dict(zip(cols, gains, strict=True))
    return lines + [""], numbers


def _runs_section(arms: dict[str, list[Run]]) -> list[str]:
    lines = ["## Runs", "", "| Arm | Run | Seed | Reward | Normalisation and rewards outside "
             "the band | Last step | Evals | Cost logged |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arm, runs in arms.items():
        for r in runs:
            n_evals = sum(len(v) for v in r.evals.values())
            lines.append(f"| {arm} | {r.path} | {r.seed} | {r.reward_kind} | {r.reward_rules} | "
                         f"{r.final_step} | {n_evals} | {'yes' if r.cost else 'no'} |")
    return lines + [""]


def _reward_section(arms: dict[str, list[Run]]) -> list[str]:
    lines = ["## Proposer rewards (eligible candidates)", "",
             "| Arm | Candidates | Mean reward | Mean distinct values per batch |",
             "| --- | --- | --- | --- |"]
    for arm, runs in arms.items():
        vals = [v for r in runs for vs in r.rewards.values() for v in vs]
        distinct = [len({round(v, 9) for v in vs}) for r in runs for vs in r.rewards.values()]
        if not distinct:
            distinct = [int(v) for r in runs for _, v in r.series("reward_distinct")]
        mean = f"{sum(vals) / len(vals):.4f}" if vals else "-"
        dist = f"{sum(distinct) / len(distinct):.2f}" if distinct else "-"
        lines.append(f"| {arm} | {len(vals)} | {mean} | {dist} |")
    return lines + [""]


def _curves_section(arms: dict[str, list[Run]]) -> tuple[list[str], dict]:
    """Per arm, each logged CURVE_FIELDS field: its mean over the final quarter of each run's
    steps, then mean over runs +- sample s.d. (and the whole-run mean)."""
    keys = [k for k in CURVE_FIELDS if any(r.series(k) for rs in arms.values() for r in rs)]
    if not keys:
        return [], {}
    lines = ["## Self-play curves (final quarter of the steps; mean over runs ± s.d.)", "",
             "| Arm | " + " | ".join(keys) + " |", "| --- |" + " --- |" * len(keys)]
    numbers: dict = {}
    for arm, runs in arms.items():
        cells = []
        for k in keys:
            finals = [sum(v for s, v in pts) / len(pts) for r in runs
                      if (pts := [(s, v) for s, v in r.series(k) if s >= r.window_start()])]
            st = stat(finals)
            numbers.setdefault(arm, {})[k] = None if st is None else {
                "mean": st.mean, "sd": st.sd, "n": st.n}
            cells.append(_cell4(st))
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines + [""], numbers


def _final_curve(run: Run, key: str) -> float | None:
    pts = [v for s, v in run.series(key) if s >= run.window_start()]
    return sum(pts) / len(pts) if pts else None


def _final_mean(run: Run, bs: list[str]) -> float | None:
    vals = [run.final_quarter(b) for b in bs]
    return sum(vals) / len(vals) if vals and all(v is not None for v in vals) else None


def per_seed(runs: list[Run], value) -> dict[int, float]:
    """seed -> value(run) over the runs with a seed and a value."""
    return {r.seed: v for r in runs if r.seed is not None and (v := value(r)) is not None}


def paired_section(arms: dict[str, list[Run]], baseline: str | None,
                   benchmarks: list[str]) -> tuple[list[str], dict]:
    """Every arm minus the baseline, paired by seed: final-quarter accuracy per benchmark (and
    their Mean) and each logged curve field."""
    if baseline is None or baseline not in arms:
        return [], {}
    metrics: dict = {b: (lambda r, b=b: r.final_quarter(b)) for b in benchmarks}
    if benchmarks:
        metrics["Mean"] = lambda r: _final_mean(r, benchmarks)
    metrics.update({k: (lambda r, k=k: _final_curve(r, k)) for k in CURVE_FIELDS})
    lines = [f"## Paired by seed: each arm minus {baseline}", "",
             "Per seed both arms ran: the difference of their final-quarter values; mean, 95% "
             "bootstrap interval over seeds, two-sided sign-flip p, and the smallest p that "
             "number of seeds can give (with 3 seeds 0.25: no effect can be significant).", "",
             "| Arm | Metric | Difference |", "| --- | --- | --- |"]
    numbers: dict = {}
    for arm, runs in arms.items():
        if arm == baseline:
            continue
        for name, value in metrics.items():
            d = paired_diff(per_seed(runs, value), per_seed(arms[baseline], value))
            if d is None:
                continue
            numbers.setdefault(arm, {})[name] = d.as_dict()
            scale, digits = (100.0, 2) if name in benchmarks or name == "Mean" else (1.0, 4)
            lines.append(f"| {arm} | {name}{' (%)' if scale == 100.0 else ''} | "
                         f"{d.text(scale, digits)} |")
    if not numbers:
        return [f"## Paired by seed: each arm minus {baseline}", "",
                "_no arm shares a seed with the baseline_", ""], {}
    return lines + [""], numbers


def _cell4(s: Stat | None) -> str:
    if s is None:
        return "-"
    return f"{s.mean:.4f}" + (f" ±{s.sd:.4f}" if s.sd is not None else "")


def build_report(run_dirs: list[str], out: str | Path, baseline: str | None = None,
                 group_by: str = "name") -> Path:
    """Write report.md, summary.json and the figures into `out`; returns report.md's path."""
    from compassplay.eval.report import plots as report_plots  # lazy: keeps the CLI start light

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = [load_run(d) for d in run_dirs]
    arms = group_runs(runs, group_by)
    if baseline is not None and baseline not in arms:
        raise ValueError(f"--baseline {baseline!r} is not an arm; arms: {', '.join(arms)}")
    if baseline is not None:  # baseline first, as in the paper's tables
        arms = {baseline: arms[baseline], **{k: v for k, v in arms.items() if k != baseline}}
    benchmarks = sorted({b for r in runs for b in r.evals})
    domains = domains_of(benchmarks)
    md = ["# CompassPlay report", "",
          f"{len(runs)} runs in {len(arms)} arms (grouped by {group_by}); baseline: "
          f"{baseline or 'none'}. Scores: mean accuracy over the final {FINAL_FRACTION:.0%} "
          "of each run's steps, then mean over runs ± sample s.d.", ""]
    md += _runs_section(arms)
    summary: dict = {"arms": {a: [str(r.path) for r in rs] for a, rs in arms.items()},
                     "baseline": baseline, "tables": {}, "figures": {}, "notes": []}
    md += ["## Accuracy", ""]
    if not benchmarks:
        note = "no eval records in metrics.jsonl: no accuracy tables"
        md += [f"_{note}_", ""]
        summary["notes"].append(note)
    for dom, bs in domains.items():
        if bs:
            lines, numbers = table(arms, bs, baseline, DOMAIN_TITLES[dom])
            md += lines
            summary["tables"][dom] = numbers
    md += _reward_section(arms)
    curve_lines, summary["curves"] = _curves_section(arms)
    md += curve_lines
    paired_lines, summary["paired"] = paired_section(arms, baseline, benchmarks)
    md += paired_lines
    figures = [
        ("Accuracy against step", report_plots.accuracy_vs_step(
            arms, [b for bs in domains.values() for b in bs], out / "accuracy_vs_step.png")),
        ("Accuracy against cumulative compute", report_plots.accuracy_vs_cost(
            arms, {"in-domain": domains["code"], "out-of-domain": domains["math"]},
            out / "accuracy_vs_compute.png")),
        ("Proposer rewards", report_plots.rewards(arms, out / "rewards.png")),
        ("Reference loss, coverage, copy and rename rates against step",
         report_plots.curves(arms, out / "curves.png")),
        ("Reference loss against cumulative compute",
         report_plots.reference_loss_vs_cost(arms, out / "reference_loss_vs_compute.png")),
    ]
    md += ["## Figures", ""]
    for title, got in figures:
        if isinstance(got, Path):
            md += [f"### {title}", "", f"![{title}]({got.name})", ""]
            summary["figures"][title] = got.name
        else:
            md += [f"- {title}: _{got}_"]
            summary["notes"].append(got)
    md.append("")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    path = out / "report.md"
    path.write_text("\n".join(md))
    return path


def run(args: argparse.Namespace) -> int:
    try:
        path = build_report(args.run_dirs, args.out, args.baseline, args.group_by)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0
