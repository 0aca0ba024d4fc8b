"""`compassplay experiment`: every arm x seed as a real local run, then the report."""

from __future__ import annotations

import json

import pytest

from compassplay.cli import main
from compassplay.commands.experiment import EXPERIMENTS


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_dry_run_validates_every_arm_and_prints_one_command_per_run(name, tmp_path, capsys):
    assert main(["experiment", name, "--out", str(tmp_path), "--seeds", "3", "4",
                 "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    exp = EXPERIMENTS[name]
    assert len(lines) == 2 * len(exp.arms)
    for arm in exp.arms:
        mine = [x for x in lines if x.startswith(f"{arm} seed ")]
        assert len(mine) == 2 and all(f"run.name={arm}-seed" in x for x in mine)
        assert all(o in mine[0] for o in exp.arms[arm] + exp.common)
    assert not (tmp_path / "runs").exists()


def test_a_bad_override_fails_before_anything_runs(tmp_path, capsys):
    assert main(["experiment", "external-reference", "--out", str(tmp_path),
                 "--set", "pipeline.staleness=0", "reward.eta=-1"]) == 2
    assert "reward.eta" in capsys.readouterr().err and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_experiment_runs_every_arm_reports_and_keeps_finished_runs(tmp_path):
    out = tmp_path / "exp"
    args = ["experiment", "local-reference", "--out", str(out), "--seeds", "0", "--steps",
            "1", "--eval-every", "0"]
    assert main(args) == 0
    record = json.loads((out / "experiment.json").read_text())
    assert [(r["arm"], r["status"]) for r in record["runs"]] == [
        ("cosine", "ok"), ("cos_novelty", "ok"), ("novelty", "ok")]
    for r in record["runs"]:
        [step] = [json.loads(x) for x in open(f"{r['dir']}/metrics.jsonl")]
        assert step["reference_loss"] > 0 and step["copy_rate"] is not None
    summary = json.loads((out / "report" / "summary.json").read_text())
    assert list(summary["arms"]) == ["cosine", "cos_novelty", "novelty"]
    assert "curves.png" in summary["figures"].values()
    md = (out / "report" / "report.md").read_text()
    assert "## Experiment" in md and "compassplay experiment local-reference --out" in md
    assert "- cos_novelty: reference_loss: " in md and "(n=1, min p 1)" in md
    assert summary["paired"]["cos_novelty"]["reference_loss"]["n"] == 1
    assert main(args) == 0  # a second call keeps the finished runs
    again = json.loads((out / "experiment.json").read_text())
    assert {r["status"] for r in again["runs"]} == {"kept"}
    assert [r["wall_s"] for r in again["runs"]] == [r["wall_s"] for r in record["runs"]]
