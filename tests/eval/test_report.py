"""`compassplay report` on synthetic runs with known final-quarter means."""

from __future__ import annotations

import json

import pytest

from compassplay.cli import main
from compassplay.commands.plot import plot_run
from compassplay.eval.report.data import arm_name, load_run
from tests.eval.runs import make_run


def test_arm_names():
    assert [arm_name(n) for n in ("cos-seed1", "cos_seed2", "cos-s3", "cosseed4", "steps200",
                                  "azr")] == ["cos", "cos", "cos", "cos", "steps200", "azr"]


def test_report_tables_gains_and_figures(tmp_path):
    runs = [make_run(tmp_path, f"azr-seed{i}", i, "difficulty", 0.0) for i in (1, 2, 3)]
    runs += [make_run(tmp_path, f"cos-seed{i}", i, "cosine", 0.02, lean=True) for i in (1, 2)]
    out = tmp_path / "out"
    assert main(["report", *map(str, runs), "--baseline", "azr", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    code = summary["tables"]["code"]
    # final quarter = evals at steps 6 and 8: 0.3 + 0.07 (+offset) +- 0.005 by seed parity
    assert code["azr"]["cruxeval-o"]["mean"] == pytest.approx(0.37 + 0.005 / 3)
    assert code["azr"]["cruxeval-o"]["n"] == 3
    assert code["cos"]["Mean"]["mean"] == pytest.approx(0.39)
    assert code["cos"]["Mean"]["sd"] == pytest.approx(0.00707, abs=1e-4)
    assert code["gain:cos"]["cruxeval-o"] == "+1.83"
    # step-0 evals pooled over all runs (the same base model): (3 * 0.3 + 2 * 0.32) / 5 + 0.001
    assert code["Base model"]["cruxeval-o"] == pytest.approx(0.309)
    assert set(summary["tables"]) == {"code", "math"}
    md = (out / "report.md").read_text()
    assert "| Gain of cos over azr |" in md and "Out-of-domain mathematics" in md
    # paired by seed (seeds 1 and 2 in both arms): the same seed noise cancels, +0.02 each
    paired = summary["paired"]["cos"]["cruxeval-o"]
    assert paired["seeds"] == [1, 2] and paired["mean"] == pytest.approx(0.02)
    assert paired["ci_low"] == pytest.approx(0.02) and paired["p"] == 0.5
    assert paired["min_p"] == 0.5 and "## Paired by seed: each arm minus azr" in md
    # curves: final quarter (steps 6-8) of reference_loss = 2.0 - 0.02 - 0.01 s, per run
    curves = summary["curves"]
    assert curves["cos"]["reference_loss"]["mean"] == pytest.approx(2.0 - 0.02 - 0.07)
    assert curves["cos"]["copy_rate"]["mean"] == pytest.approx(0.48)
    assert curves["azr"]["copy_rate"] is None and "## Self-play curves" in md
    for png in ("accuracy_vs_step.png", "accuracy_vs_compute.png", "rewards.png", "curves.png",
                "reference_loss_vs_compute.png"):
        assert (out / png).stat().st_size > 1000, png


def test_missing_fields_skip_figures_with_notes(tmp_path):
    runs = [make_run(tmp_path, f"r-seed{i}", i, "cosine", 0.0, cost=False, samples=False,
                     benchmarks=()) for i in (1, 2)]
    out = tmp_path / "out"
    assert main(["report", *map(str, runs), "--group-by", "reward", "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "no eval records" in md and "cumulative_device_seconds" in md
    assert "step curves skipped" in md and "reference-loss-vs-compute skipped" in md
    assert (out / "rewards.png").exists()  # reward_distinct from the step lines
    assert list(json.loads((out / "summary.json").read_text())["arms"]) == ["cosine"]
    assert main(["report", str(runs[0]), "--baseline", "nope", "--out", str(out)]) == 2


def test_plot_ignores_eval_and_cost_lines(tmp_path):
    run = make_run(tmp_path, "p", 0, "cosine", 0.0)
    assert load_run(run).evals["math500"][0] == (0, pytest.approx(0.295))
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    full = ["proposals", "valid", "eligible", "solve_rate_mean", "solver_accuracy", "reward_std",
            "loss", "grad_norm"]
    lines = []
    for r in rows:  # complete the step lines so plot_run can draw them
        if "kind" not in r:
            r.update({k: 0.0 for k in full}, stage_seconds={"generate": 1.0})
        lines.append(json.dumps(r))
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert plot_run(run).exists()


def test_runs_table_states_normalisation_and_rewards_outside_the_band(tmp_path):
    new = make_run(tmp_path, "cos-seed1", 1, "cosine", 0.0)
    cfg = new / "config.yaml"
    cfg.write_text(cfg.read_text() + "  normalize: eligible\n")
    old = make_run(tmp_path, "azr-seed1", 1, "difficulty", 0.0)  # written before 2026-12-01
    (old / "config.yaml").write_text((old / "config.yaml").read_text()
                                     + "  azr_compat: false\n  format_penalty: -1.0\n")
    assert load_run(new).reward_rules == ("normalize=eligible; unparsed -1, ill-posed -1, "
                                          "ineligible -0.5")
    assert load_run(old).reward_rules == ("normalize=all; unparsed -1, ill-posed -0.5, "
                                          "ineligible 0")
    out = tmp_path / "out"
    assert main(["report", str(new), str(old), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "| Normalisation and rewards outside the band |" in md
    assert "| normalize=eligible; unparsed -1, ill-posed -1, ineligible -0.5 |" in md
