"""A learner group of 2 rank actors (DeepSpeed ZeRO-3 over gloo, 0.25 CPU each) in the Ray
pipeline on the 2-CPU local Ray: learn calls and snapshots go to both ranks, rank 0's results
are recorded, and the checkpoint is the rank-count-independent one."""

import json
from pathlib import Path

import pytest

from compassplay.config import load_config
from compassplay.executors.local import LocalExecutor
from compassplay.executors.ray.pipeline_runner import run_pipeline

pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.slow, pytest.mark.ray]

WARM = Path(__file__).resolve().parents[3] / "compassplay" / "configs" / "micro_warm.yaml"
FAST = ["proposer.batch_size=2", "solver.n_samples=4", "solver.seed_tasks_per_step=1",
        "logging.progress=false", "pipeline.steps=2", "learner.checkpoint_every=1"]


def test_two_rank_learner_group_runs_the_pipeline(tmp_path, ray_local):
    group = FAST + ["learner.backend=deepspeed", "learner.zero_stage=3", "learner.num_ranks=2",
                    "cluster.learner.num_cpus=0.25"]
    pipeline = run_pipeline(load_config(WARM, group), tmp_path / "ray")
    got = pipeline.recorded
    assert [s.step for s in got] == [0, 1] and [s.weight_version for s in got] == [1, 2]
    # the same steps with one torch learner in process: same rollouts, same update
    LocalExecutor(load_config(WARM, FAST), tmp_path / "local").run()
    rows = [json.loads(x) for x in (tmp_path / "local/metrics.jsonl").read_text().splitlines()]
    want = [r for r in rows if r.get("kind", "step") == "step"]
    for s, w in zip(got, want, strict=True):
        assert s.loss == pytest.approx(w["loss"], rel=1e-4, abs=1e-6)
        assert s.grad_norm == pytest.approx(w["grad_norm"], rel=1e-4)
    last = sorted((tmp_path / "ray" / "checkpoints").glob("step_*"))[-1]
    ck = last / "learner"
    assert {"optimizer.safetensors", "optimizer.json", "scheduler.pt",
            "learner.json"} <= {p.name for p in ck.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {
        p.name for p in (last / "model").iterdir()}  # the full weights gathered from 2 ranks
    assert json.loads((ck / "optimizer.json").read_text())["world_size"] == 2
