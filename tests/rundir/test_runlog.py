"""RunLog.rewind counts step lines only: eval lines in between stay, later ones go."""

import json

from compassplay.config import RunConfig
from compassplay.eval.eval_records import EvalMetric
from compassplay.records import StepStats
from compassplay.rundir.runlog import RunLog, read_metrics


def _stats(step: int, loss: float = 0.0) -> StepStats:
    return StepStats(step=step, weight_version=step + 1, proposals=0, valid=0, eligible=0,
                     solve_rate_mean=0, reward_mean=0, reward_std=0, reward_distinct=0,
                     loss=loss, grad_norm=0, solver_accuracy=0)


def test_rewind_keeps_eval_lines_of_kept_steps(tmp_path):
    log = RunLog(tmp_path, RunConfig())
    for s in range(4):
        log.write(_stats(s))
        log.write_line(EvalMetric(step=s, version=s + 1, benchmark="cruxeval-o", accuracy=0.5))
    # checkpoint after step 2 remembers steps 1 and 2: keep 1 step line, rewrite 2
    log.rewind(1, [_stats(1, loss=1.0), _stats(2, loss=2.0)])
    log.close()
    rows = read_metrics(tmp_path / "metrics.jsonl", kind=None)
    assert [(r.get("kind", "step"), r["step"]) for r in rows] == [
        ("step", 0), ("eval", 0), ("step", 1), ("eval", 1), ("step", 2), ("eval", 2)]
    assert [r["loss"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0.0, 1.0, 2.0]
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl", "eval")] == [0, 1, 2]


def test_rewind_drops_the_samples_of_the_steps_it_drops(tmp_path):
    """A step run again after a rollback writes its samples once more: the first run's go."""
    log = RunLog(tmp_path, RunConfig())
    for s in range(4):
        log.write(_stats(s))
        log.write_samples([{"step": s, "task_id": f"s{s}-t{i}"} for i in range(2)])
    log.rewind(1, [_stats(1)])  # the checkpoint after step 1: steps 2 and 3 run again
    log.write(_stats(2))
    log.write_samples([{"step": 2, "task_id": "s2-t0"}])
    log.close()
    rows = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in rows] == ["s0-t0", "s0-t1", "s1-t0", "s1-t1", "s2-t0"]


def test_rewind_appends_steps_the_driver_never_wrote(tmp_path):
    log = RunLog(tmp_path, RunConfig())
    log.write(_stats(0))
    log.write_line(EvalMetric(step=0, version=1, benchmark="cruxeval-o", accuracy=0.5))
    log.rewind(1, [_stats(1), _stats(2)])
    log.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0, 0, 1, 2]
