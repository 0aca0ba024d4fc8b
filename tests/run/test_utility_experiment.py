"""`compassplay experiment utility` end to end on the warm micro model: a pool collected
without learning, every score and utility per candidate, the summary and the report."""

import json

import pytest

from compassplay.cli import main


def _math(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    rows = [{"problem": f"What is {i} + {2 * i}?", "solution": f"{i} + {2 * i} = "
             f"$\\boxed{{{3 * i}}}$.", "level": "Level 1", "subject": "Prealgebra"}
            for i in range(30)]
    (d / "math_solutions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


@pytest.mark.slow
def test_utility_experiment_on_the_micro_model(tmp_path):
    out = tmp_path / "u"
    args = ["experiment", "utility", "--out", str(out), "--data-dir", str(_math(tmp_path)),
            "--base", "micro_warm", "--candidates", "4", "--max-steps", "8",
            "--proposals-per-type", "6",
            "--heldout-items", "6", "--lr", "1e-3", "--set", "logging.progress=false"]
    assert main(args) == 0
    rows = [json.loads(x) for x in (out / "candidates.jsonl").read_text().splitlines()]
    assert len(rows) == 4  # the first --candidates of the pool, which may hold more
    for r in rows:
        assert 0 < r["solve_rate"] < 1 and r["score_difficulty"] == 1 - r["solve_rate"]
        assert -1 <= r["score_cos"] <= 1 and r["utility"] != 0 and r["utility_ref"] != 0
        assert r["sgd_predicted_ref"] == pytest.approx(r["eta"] * r["score_inner"], rel=1e-3)
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["spearman"]) == {"cos", "inner", "difficulty", "novelty",
                                        "cos_novelty", "random"}
    assert summary["n"] == len(rows) and summary["detectable_rho"] > 0.7  # a few: no power
    # cos and inner share their sign; the first-order fit on the SGD check is defined
    assert summary["first_order"]["n"] == len(rows)
    md = (out / "report.md").read_text()
    assert "Power:" in md and (out / "scores_vs_utility.png").stat().st_size > 1000
    pool = (out / "pool.jsonl").read_text()
    assert main(args) == 0  # a rerun reuses the pool and the measured rows
    assert (out / "pool.jsonl").read_text() == pool
    assert len((out / "candidates.jsonl").read_text().splitlines()) == len(rows)
