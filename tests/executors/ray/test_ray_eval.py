"""Evaluation during training on its own actor (Ray): results for every step, written with
their step and version, and training does not wait for them."""

from pathlib import Path

import pytest

from compassplay.config import load_config
from compassplay.executors.ray.pipeline_runner import run_pipeline
from tests.executors.eval_fixture import check_run, write_cruxeval

pytestmark = [pytest.mark.slow, pytest.mark.ray]

MICRO = Path(__file__).resolve().parents[3] / "compassplay" / "configs" / "micro.yaml"
FAST = ["proposer.batch_size=2", "solver.n_samples=2", "proposer.max_new_tokens=24",
        "solver.max_new_tokens=16", "logging.progress=false"]


def test_eval_actor_evaluates_every_step_without_stalling_training(tmp_path, ray_local):
    # 12 items x 32 new tokens: an evaluation takes seconds, longer than the driver needs
    # to submit the next step
    data = write_cruxeval(tmp_path / "data", copies=4)
    cfg = load_config(MICRO, FAST + ["pipeline.steps=3", "eval.every_steps=1",
                                     f"eval.data_dir={data}", "eval.max_new_tokens=32",
                                     "eval.max_pending=8"])
    pipe = run_pipeline(cfg, tmp_path / "run")
    rows, _ = check_run(tmp_path / "run", steps=3, items=12, out=tmp_path / "report")
    reports = pipe.eval_reports
    assert [(r.step, r.version) for r in reports] == [(0, 1), (1, 2), (2, 3)]
    # training went on while step 0's weights were evaluated
    assert rows[1]["step_start"] < reports[0].timing.end
    assert reports[0].timing.seconds > 0
