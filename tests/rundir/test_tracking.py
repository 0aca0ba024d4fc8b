"""Trackers: every scalar of metrics.jsonl in TensorBoard event files of the run directory
(read back with TensorBoard's own reader), a rewind leaves each step once, and wandb is
offline or a clear error when it is asked for and missing."""

from __future__ import annotations

import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from compassplay.config import RunConfig
from compassplay.errors import RunError
from compassplay.eval.eval_records import EvalMetric
from compassplay.records import StepStats
from compassplay.rundir.runlog import RunLog
from compassplay.rundir.tracking import scalars


def _stats(step: int, loss: float = 0.0) -> StepStats:
    return StepStats(step=step, weight_version=step + 1, proposals=3, valid=2, eligible=1,
                     solve_rate_mean=0.5, reward_mean=0.25, reward_std=0.1, reward_distinct=1,
                     loss=loss, grad_norm=1.5, solver_accuracy=0.5, lr=1e-3, clip_frac=0.125,
                     kl=0.01, entropy=2.5, response_length_mean=12.0,
                     stage_seconds={"propose": 1.0, "learn": 2.0},
                     by_task_type={"deduction": {"valid": 2.0}}, solve_rates=[0.5])


def _events(run_dir) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def test_scalars_flatten_every_number_and_skip_the_rest():
    got = scalars(_stats(3).model_dump(mode="json"))
    assert got["entropy"] == 2.5 and got["lr"] == 1e-3 and got["clip_frac"] == 0.125
    assert got["stage_seconds/learn"] == 2.0 and got["by_task_type/deduction/valid"] == 2.0
    assert "step" not in got and "solve_rates" not in got and "coverage" not in got
    ev = scalars(EvalMetric(step=3, version=4, benchmark="humaneval", accuracy=0.5).model_dump())
    assert ev == {"eval/humaneval/version": 4.0, "eval/humaneval/accuracy": 0.5,
                  "eval/humaneval/n": 0.0, "eval/humaneval/seconds": 0.0}


def test_tensorboard_holds_every_scalar_of_metrics_jsonl(tmp_path):
    cfg = RunConfig()
    run = tmp_path / "runs" / "alpha"
    log = RunLog(run, cfg)
    for s in range(3):
        log.write(_stats(s, loss=float(s)))
    log.write_line(EvalMetric(step=2, version=3, benchmark="humaneval", accuracy=0.75))
    log.close()
    acc = _events(run)
    tags = set(acc.Tags()["scalars"])
    assert set(scalars(_stats(0).model_dump(mode="json"))) <= tags
    assert {"lr", "clip_frac", "kl", "entropy", "response_length_mean"} <= tags
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(0, 0.0), (1, 1.0), (2, 2.0)]
    assert [(e.step, e.value) for e in acc.Scalars("eval/humaneval/accuracy")] == [(2, 0.75)]


def test_rewind_and_resume_leave_each_step_once(tmp_path):
    run = tmp_path / "r"
    log = RunLog(run, RunConfig())
    for s in range(4):
        log.write(_stats(s, loss=float(s)))
    log.rewind(2, [])  # restored from the checkpoint after step 1: steps 2, 3 are redone
    log.write(_stats(2, loss=20.0))
    log.close()
    assert [(e.step, e.value) for e in _events(run).Scalars("loss")] == [
        (0, 0.0), (1, 1.0), (2, 20.0)]
    log = RunLog(run, RunConfig(), resume=True)  # a new process resumes after step 1
    log.rewind(1, [_stats(1, loss=10.0)])
    log.write(_stats(2, loss=200.0))
    log.close()
    assert [(e.step, e.value) for e in _events(run).Scalars("loss")] == [
        (0, 0.0), (1, 10.0), (2, 200.0)]


def test_tensorboard_can_be_turned_off(tmp_path):
    cfg = RunConfig()
    cfg.logging.tensorboard = False
    log = RunLog(tmp_path, cfg)
    log.write(_stats(0))
    log.close()
    assert not list(tmp_path.glob("events.out.tfevents.*"))


def test_wandb_asked_for_but_missing_names_the_field(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    cfg = RunConfig()
    cfg.logging.wandb = True
    with pytest.raises(RunError, match=r"logging\.wandb=true but wandb is not installed"):
        RunLog(tmp_path, cfg)


def test_wandb_logs_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = RunConfig()
    cfg.logging.wandb = True
    cfg.run.name = "offline-run"
    log = RunLog(tmp_path, cfg)
    log.write(_stats(0))
    log.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), list((tmp_path / "wandb").iterdir())
