"""Evaluation during training and cost accounting in the local executor (in process, after
the step, blocking), on the micro config with a 3-item CRUXEval-O fixture."""

from pathlib import Path

from compassplay.config import load_config
from compassplay.executors.local import LocalExecutor
from compassplay.plan.resources import requests
from compassplay.rundir.runlog import read_metrics
from tests.executors.eval_fixture import check_run, write_cruxeval

MICRO = Path(__file__).resolve().parents[2] / "compassplay" / "configs" / "micro.yaml"
FAST = ["proposer.batch_size=2", "solver.n_samples=2", "proposer.max_new_tokens=24",
        "solver.max_new_tokens=16", "logging.progress=false"]


def test_no_eval_actor_unless_eval_is_on():
    assert "eval" not in requests(load_config(MICRO))
    assert requests(load_config(MICRO, ["eval.every_steps=2"]))["eval"] == {"CPU": 0.25}


def test_local_executor_evaluates_after_each_step(tmp_path):
    data = write_cruxeval(tmp_path / "data")
    cfg = load_config(MICRO, FAST + ["pipeline.steps=2", "eval.every_steps=1",
                                     f"eval.data_dir={data}", "eval.max_new_tokens=8"])
    ex = LocalExecutor(cfg, tmp_path / "run")
    assert ex.evaluator is not None
    ex.run()
    check_run(tmp_path / "run", steps=2, items=3, out=tmp_path / "report")
    # in process the evaluation blocks: each eval line follows its step's line
    order = [(r.get("kind", "step"), r["step"])
             for r in read_metrics(tmp_path / "run" / "metrics.jsonl", None)]
    assert order == [("step", 0), ("eval", 0), ("step", 1), ("eval", 1)]
