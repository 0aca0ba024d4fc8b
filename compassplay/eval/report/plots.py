"""The PNG figures of `compassplay report` (matplotlib, Agg). Each function returns the path
it wrote, or a note saying why the figure was skipped (missing fields)."""

from __future__ import annotations

from pathlib import Path

from compassplay.eval.benchmarks import BENCHMARKS
from compassplay.eval.eval_records import COST_FIELD, CURVE_FIELDS
from compassplay.eval.report.data import Run, cost_at, stat


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grid(n: int):
    plt = _plt()
    cols = min(4, max(1, n))
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    return plt, fig, list(axes.flat)


def _save(plt, fig, out: Path) -> Path:
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


def _by_step(pairs_per_run: list[list[tuple[int, float]]]) -> tuple[list, list, list]:
    """Steps, mean and sd across runs of per-run (step, value) series."""
    at: dict[int, list[float]] = {}
    for pairs in pairs_per_run:
        for s, v in pairs:
            at.setdefault(s, []).append(v)
    steps = sorted(at)
    stats = [stat(at[s]) for s in steps]
    return steps, [st.mean for st in stats], [st.sd or 0.0 for st in stats]


def accuracy_vs_step(arms: dict[str, list[Run]], benchmarks: list[str], out: Path
                     ) -> Path | str:
    if not benchmarks:
        return "accuracy curves skipped: no eval records in metrics.jsonl"
    plt, fig, axes = _grid(len(benchmarks))
    for ax, b in zip(axes, benchmarks, strict=False):
        for arm, runs in arms.items():
            steps, mean, sd = _by_step([r.evals.get(b, []) for r in runs])
            if steps:
                ax.errorbar(steps, [100 * m for m in mean], yerr=[100 * s for s in sd],
                            marker=".", capsize=2, label=arm)
        starts = [r.window_start() for rs in arms.values() for r in rs]
        ends = [r.final_step for rs in arms.values() for r in rs]
        if starts:
            ax.axvspan(min(starts), max(ends), color="grey", alpha=0.12)
        dom = BENCHMARKS[b].domain if b in BENCHMARKS else "other"
        ax.set_title(f"{b} ({'in-domain' if dom == 'code' else 'out-of-domain'})"
                     if dom != "other" else b)
        ax.set_xlabel("step")
        ax.set_ylabel("accuracy (%)")
        ax.legend(fontsize=7)
    return _save(plt, fig, out)


def accuracy_vs_cost(arms: dict[str, list[Run]], domains: dict[str, list[str]], out: Path
                     ) -> Path | str:
    """Domain mean accuracy against cumulative device-hours, one point per arm and step."""
    if not any(r.cost for rs in arms.values() for r in rs):
        return f"accuracy-vs-compute skipped: no `{COST_FIELD}` in metrics.jsonl"
    panels = [(d, bs) for d, bs in domains.items() if bs]
    if not panels:
        return "accuracy-vs-compute skipped: no eval records"
    plt, fig, axes = _grid(len(panels))
    for ax, (dom, bs) in zip(axes, panels, strict=False):
        for arm, runs in arms.items():
            pts: dict[int, list[tuple[float, float]]] = {}
            for r in runs:
                steps = set.intersection(*[{s for s, _ in r.evals.get(b, [])} for b in bs])
                for s in sorted(steps):
                    c = cost_at(r, s)
                    if c is None:
                        continue
                    acc = sum(dict(r.evals[b])[s] for b in bs) / len(bs)
                    pts.setdefault(s, []).append((c / 3600.0, acc))
            if pts:
                xs = [sum(c for c, _ in v) / len(v) for _, v in sorted(pts.items())]
                ys = [100 * sum(a for _, a in v) / len(v) for _, v in sorted(pts.items())]
                ax.plot(xs, ys, marker=".", label=arm)
        ax.set_title(f"{dom} mean ({', '.join(bs)})", fontsize=8)
        ax.set_xlabel("cumulative device-hours")
        ax.set_ylabel("accuracy (%)")
        ax.legend(fontsize=7)
    return _save(plt, fig, out)


def rewards(arms: dict[str, list[Run]], out: Path) -> Path | str:
    """Per arm: reward distribution per step (eligible candidates) and distinct values."""
    has_samples = any(r.rewards for rs in arms.values() for r in rs)
    has_distinct = any(r.series("reward_distinct") for rs in arms.values() for r in rs)
    if not has_samples and not has_distinct:
        return "reward plots skipped: no samples.jsonl rewards and no reward_distinct"
    plt, fig, axes = _grid(len(arms) + 1)
    for ax, (arm, runs) in zip(axes, arms.items(), strict=False):
        per_step: dict[int, list[float]] = {}
        for r in runs:
            for s, vals in r.rewards.items():
                per_step.setdefault(s, []).extend(vals)
        if per_step:
            steps = sorted(per_step)
            stride = max(1, len(steps) // 20)
            shown = steps[::stride]
            ax.boxplot([per_step[s] for s in shown], positions=shown,
                       widths=max(0.5, 0.6 * stride), showfliers=False)
            ax.set_title(f"{arm}: reward of eligible candidates", fontsize=9)
        else:
            ax.set_title(f"{arm}: no samples.jsonl rewards", fontsize=9)
        ax.set_xlabel("step")
    ax = axes[len(arms)]
    for arm, runs in arms.items():
        series = [_distinct(r) for r in runs]
        steps, mean, _ = _by_step(series)
        if steps:
            ax.plot(steps, mean, marker=".", label=arm)
    ax.set_title("distinct reward values per batch", fontsize=9)
    ax.set_xlabel("step")
    ax.legend(fontsize=7)
    return _save(plt, fig, out)


def _distinct(run: Run) -> list[tuple[int, float]]:
    """Distinct rewards among eligible candidates per step (samples.jsonl), else the step
    line's reward_distinct."""
    if run.rewards:
        return [(s, float(len({round(v, 9) for v in vals})))
                for s, vals in sorted(run.rewards.items())]
    return run.series("reward_distinct")


def curves(arms: dict[str, list[Run]], out: Path) -> Path | str:
    """Each logged CURVE_FIELDS field against the step, mean +- s.d. over each arm's runs."""
    present = [k for k in CURVE_FIELDS if any(r.series(k) for rs in arms.values() for r in rs)]
    if not present:
        return f"step curves skipped: no {' / '.join(CURVE_FIELDS)} fields in metrics.jsonl"
    plt, fig, axes = _grid(len(present))
    for ax, key in zip(axes, present, strict=False):
        for arm, runs in arms.items():
            steps, mean, sd = _by_step([r.series(key) for r in runs])
            if steps:
                ax.errorbar(steps, mean, yerr=sd, marker=".", capsize=2, label=arm)
        ax.set_title(key.replace("_", " "))
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    return _save(plt, fig, out)


def reference_loss_vs_cost(arms: dict[str, list[Run]], out: Path) -> Path | str:
    """The reference loss against cumulative device-seconds, one line per run."""
    runs = [(arm, r) for arm, rs in arms.items() for r in rs if r.series("reference_loss")]
    if not runs or not any(r.cost for _, r in runs):
        return ("reference-loss-vs-compute skipped: no reference_loss (logging.reference_loss)"
                f" or no `{COST_FIELD}` in metrics.jsonl")
    plt, fig, axes = _grid(1)
    colors: dict[str, str] = {}
    for arm, r in runs:
        pts = [(cost_at(r, s), v) for s, v in r.series("reference_loss")]
        pts = [(c, v) for c, v in pts if c is not None]
        if pts:
            line, = axes[0].plot([c for c, _ in pts], [v for _, v in pts], marker=".",
                                 color=colors.get(arm), label=None if arm in colors else arm)
            colors.setdefault(arm, line.get_color())
    axes[0].set_xlabel("cumulative device-seconds")
    axes[0].set_ylabel("reference loss (nats/token)")
    axes[0].legend(fontsize=7)
    return _save(plt, fig, out)
