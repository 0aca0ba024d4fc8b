"""`compassplay experiment utility` and `experiment selection` end to end on the warm micro
model: a run's checkpoint, a pool collected without learning, every score and the realized
utility three ways per candidate (the run's AdamW continued from the checkpoint's moments),
the analysis, then the best-of-m selection comparison on those candidates; and the selection
design's pieces on their own."""

import json

import numpy as np
import pytest

from compassplay.cli import main
from compassplay.commands.selection_experiment import (
    design_power,
    paired,
    select,
    subpools,
    t975,
)


def _data(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    rows = [{"problem": f"What is {i} + {2 * i}?", "solution": f"{i} + {2 * i} = "
             f"$\\boxed{{{3 * i}}}$.", "level": "Level 1", "subject": "Prealgebra"}
            for i in range(30)]
    (d / "math_solutions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    crux = [{"code": f"def f(x):\n    return x + {i}", "input": "1", "output": str(1 + i),
             "id": f"sample_{i}"} for i in range(6)]
    (d / "cruxeval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in crux))
    gsm = [{"question": f"Tom has {i} apples and buys 2. How many?",
            "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"} for i in range(6)]
    (d / "gsm8k_test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gsm))
    return d


@pytest.mark.slow
def test_utility_and_selection_experiments_on_the_micro_model(tmp_path):
    data = _data(tmp_path)
    runs = tmp_path / "runs"
    assert main(["run", "--config", "micro_warm", "--executor", "local", "pipeline.steps=1",
                 f"run.output_dir={runs}", "logging.progress=false"]) == 0
    out = tmp_path / "u"
    args = ["experiment", "utility", "--out", str(out), "--data-dir", str(data),
            "--base", "micro_warm", "--candidates", "8", "--max-steps", "12",
            "--proposals-per-type", "6", "--checkpoint", str(runs / "micro_warm"),
            "--ref-split", "4", "--heldout-items", "6", "--eta", "1e-3",
            "--set", "logging.progress=false"]
    assert main(args) == 0
    rows = [json.loads(x) for x in (out / "candidates.jsonl").read_text().splitlines()]
    assert len(rows) == 8
    for r in rows:
        assert 0 < r["solve_rate"] < 1 and r["score_difficulty"] == 1 - r["solve_rate"]
        assert r["start_step"] >= 1 and "step_000000" in r["start"]  # after the run's one step
        for s in ("cos", "precond_cos", "heldout_cos"):
            assert -1 <= r[f"score_{s}"] <= 1
        for step in ("sgd", "dir", "adamw", "adamw_fresh"):
            assert r[f"drop_{step}_heldout"] != 0 and r[f"drop_{step}_ref_b"] != 0
        assert r["step_norm_dir"] == pytest.approx(r["dir_length"], rel=1e-5)
        assert r["step_norm_sgd"] == pytest.approx(r["eta"] * r["grad_norm"], rel=1e-5)
        assert r["solutions"] and r["n_solutions"] == len(r["solutions"])
    # the checkpoint's moments make (c) another step than a fresh AdamW, and precond_cos
    # another score than the plain cosine
    assert any(abs(r["drop_adamw_heldout"] - r["drop_adamw_fresh_heldout"]) > 1e-7 for r in rows)
    assert any(abs(r["score_precond_cos"] - r["score_cos"]) > 1e-4 for r in rows)
    assert len({r["dir_length"] for r in rows}) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 8 and set(summary["first_order"]) >= {"sgd_heldout", "adamw_ref_b"}
    u = summary["utilities"]["drop_adamw_heldout"]["scores"]
    assert set(u) >= {"cos", "precond_cos", "difficulty", "random", "heldout_cos"}
    assert "p_holm" in u["cos"]["within"] or u["cos"]["within"]["n"] == 0
    assert (out / "report.md").read_text().count("| cosine |") >= 4
    pool = (out / "pool.jsonl").read_text()
    assert main(args) == 0  # a rerun reuses the pool and the measured rows
    assert (out / "pool.jsonl").read_text() == pool
    assert len((out / "candidates.jsonl").read_text().splitlines()) == len(rows)

    sel = tmp_path / "sel"
    sargs = ["experiment", "selection", "--from", str(out), "--out", str(sel), "--data-dir",
             str(data), "--base", "micro_warm", "--checkpoint", str(runs / "micro_warm"),
             "--subpool", "4", "--top", "1", "--train-steps", "2", "--heldout-items", "6",
             "--secondary-items", "3", "--set", "logging.progress=false"]
    assert main(sargs) == 0
    design = json.loads((sel / "design.json").read_text())
    assert design["subpools"] == 2 and design["mde_power_0.8"] > 0
    arms = [json.loads(x) for x in (sel / "arms.jsonl").read_text().splitlines()]
    assert len(arms) == 2 * 5 and all(a["drop_heldout"] != 0 for a in arms)
    assert {k for k in arms[0] if k.startswith("drop_")} == {"drop_heldout", "drop_cruxeval_o",
                                                            "drop_gsm8k"}
    s = json.loads((sel / "summary.json").read_text())
    assert set(s["against_random"]) == {"cos", "precond_cos", "difficulty", "heldout_cos"}
    assert "positive control" in (sel / "report.md").read_text()
    assert main(sargs) == 0  # a rerun keeps the measured arms
    assert len((sel / "arms.jsonl").read_text().splitlines()) == len(arms)


def _rows(n, seed=0):
    rng = np.random.default_rng(seed)
    return [{"task_id": f"t{i}", "score_cos": float(rng.normal()),
             "score_heldout_cos": float(rng.normal()), "score_precond_cos": float(rng.normal()),
             "score_difficulty": float(rng.random()), "drop_sgd_heldout": float(rng.normal()),
             "drop_adamw_heldout": None} for i in range(n)]


def test_subpools_are_disjoint_and_arms_take_their_own_top():
    rows = _rows(23)
    pools = subpools(rows, 5, seed=1)
    assert len(pools) == 4 and all(len(p) == 5 for p in pools)
    ids = [r["task_id"] for p in pools for r in p]
    assert len(set(ids)) == 20
    assert pools == subpools(rows, 5, seed=1) and pools != subpools(rows, 5, seed=2)
    top = select(pools[0], "cos", 2, seed=0)
    assert [r["score_cos"] for r in top] == sorted((r["score_cos"] for r in pools[0]),
                                                   reverse=True)[:2]
    assert select(pools[0], "random", 2, seed=3) == select(pools[0], "random", 2, seed=3)


def test_design_power_scales_with_the_spread_and_the_number_of_subpools():
    rows = _rows(200)
    few, many = design_power(subpools(rows, 10, 0)[:5], 2), design_power(subpools(rows, 10, 0), 2)
    assert many["mde_power_0.8"] < few["mde_power_0.8"]
    # SD of the mean of 5 paired differences of means of 2 draws of unit-variance utilities:
    # about sqrt(2 * (1/2) * (1 - 2/10 * ...)) / sqrt(5); within a factor of 1.5 of 1/sqrt(5)
    assert 0.6 / 5 ** 0.5 < few["sd_of_paired_mean_difference"] < 1.5 / 5 ** 0.5


def test_paired_differences_interval_and_sign_flip_p():
    assert t975(1) == pytest.approx(12.706) and t975(200) == pytest.approx(1.972, abs=2e-3)
    clear = paired([1.0, 1.2, 0.9, 1.1, 1.05, 0.95])
    assert clear["ci_low"] > 0.8 and clear["p"] < 0.05 and clear["wins"] == 6
    null = paired([1.0, -1.0, 0.5, -0.5, 0.2, -0.2])
    assert null["mean"] == pytest.approx(0.0) and null["p"] > 0.5
    assert null["ci_low"] < 0 < null["ci_high"]
