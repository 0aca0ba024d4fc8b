"""The end-of-run summary: totals computed from metrics.jsonl, and the text a person reads."""

from compassplay.commands.summary import format_summary, run_summary
from compassplay.records import StepStats
from compassplay.rundir.runlog import METRICS_FILE


def _step(step, proposals, valid, eligible, parse=None, invalid=None):
    return StepStats(step=step, weight_version=step + 1, proposals=proposals, valid=valid,
                     eligible=eligible, solve_rate_mean=0.5, reward_mean=0.1 * step,
                     reward_std=0.0, reward_distinct=1, loss=0.01, grad_norm=1.0,
                     solver_accuracy=0.25 * step, parse_failures=parse or {},
                     invalid_reasons=invalid or {}, step_seconds=30.0,
                     wall_seconds=37.0 if step else None,
                     score_advantage_share=0.125 if eligible else None,
                     step_start=1000.0 + 20 * step, step_end=1030.0 + 20 * step)


def test_summary_totals_and_text(tmp_path):
    lines = [_step(0, 12, 3, 0, {"no_input_block": 2}), _step(1, 12, 6, 2, {"no_input_block": 1},
                                                             {"error:TypeError": 3})]
    (tmp_path / METRICS_FILE).write_text("".join(s.model_dump_json() + "\n" for s in lines)
                                         + '{"kind": "eval", "step": 1}\n')
    s = run_summary(tmp_path)
    assert (s["steps"], s["proposals"], s["valid"]) == (2, 24, 9)
    assert s["valid_rate"] == 9 / 24 and s["eligible_per_step"] == 1.0
    assert s["steps_with_eligible"] == 1 and s["seconds"] == 50.0  # overlapping steps
    assert s["parse_failures"] == {"no_input_block": 3}
    assert s["invalid_reasons"] == {"error:TypeError": 3}
    text = format_summary(s, tmp_path)
    assert "valid proposals 9/24 (38%)" in text and "6/12" in text
    assert "  share" in text.splitlines()[0] and text.splitlines()[0].endswith("wall")
    assert text.splitlines()[2].endswith("30       37")  # stages' seconds, then the wall
    assert text.splitlines()[1].endswith("30        -")  # no wall recorded
    assert "12%" in text.splitlines()[2] and "      -" in text.splitlines()[1]  # no share
    assert "parse failures: no_input_block 3" in text
    assert str(tmp_path / METRICS_FILE) in text


def test_bench_run_reports_a_finished_run_as_json(tmp_path, capsys):
    import json

    from compassplay.cli import main

    (tmp_path / METRICS_FILE).write_text(_step(0, 12, 9, 4).model_dump_json() + "\n")
    assert main(["bench", "run", "--run-dir", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["valid_rate"] == 0.75 and out["eligible_per_step"] == 4.0
    assert out["run_dir"] == str(tmp_path) and out["per_step"][0]["valid"] == 9
