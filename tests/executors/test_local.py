"""The local executor end to end on the micro config (real tiny model, real sandbox)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from compassplay.config import load_config
from compassplay.executors.local import LocalExecutor
from compassplay.records import TIMING_FIELDS

ROOT = Path(__file__).resolve().parents[2]
MICRO = ROOT / "compassplay" / "configs" / "micro.yaml"
WARM = ROOT / "compassplay" / "configs" / "micro_warm.yaml"
REQUIRED = {"step", "proposals", "valid", "eligible", "solve_rate_mean", "reward_mean",
            "reward_std", "loss", "stage_seconds"}


def test_two_step_local_run_from_the_cli(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "compassplay.cli", "run", "--config", str(MICRO), "--executor",
         "local", "pipeline.steps=2", "run.name=two", f"run.output_dir={tmp_path}"],
        capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "two"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        assert REQUIRED <= set(r)
        assert set(r["stage_seconds"]) == {"propose", "validate", "solve", "grade", "score",
                                           "learn"}
        assert r["proposals"] == 9  # 3 task types x proposer.batch_size 3
        # the wall between results holds the stages and what runs between them
        assert r["wall_seconds"] >= r["step_seconds"] > 0
        assert sum(r["parse_failures"].values()) + r["valid"] + sum(
            r["invalid_reasons"].values()) >= r["proposals"]
    assert [r["weight_version"] for r in rows] == [1, 2]
    assert "steps: 2" in (run / "config.yaml").read_text()
    assert "step 1" in (run / "run.log").read_text()
    assert (run / "checkpoints").is_dir()
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 18 and {s["step"] for s in samples} == {0, 1}
    assert all(s["reward"] is not None for s in samples) and any(s["proposal"] for s in samples)


@pytest.mark.slow
def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    """Crash after checkpoint 1 (simulated by deleting what came later), resume, compare."""
    cfg = load_config(WARM, ["pipeline.steps=4", "learner.checkpoint_every=2",
                             "learner.keep_last=3", "logging.progress=false",
                             "proposer.batch_size=2", "solver.seed_tasks_per_step=1"])
    run = tmp_path / "r"
    full = LocalExecutor(cfg, run).run()
    shutil.rmtree(run / "checkpoints" / "step_000003")
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text("".join(lines[:1]))  # the driver died before line 1
    ex = LocalExecutor(cfg, run, resume=True)
    assert ex.start_step == 2
    resumed = ex.run()
    assert [s.step for s in resumed] == [2, 3]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]

    def strip(d):
        return {k: v for k, v in d.items() if k not in TIMING_FIELDS}

    assert [strip(r) for r in rows] == [strip(s.model_dump(mode="json")) for s in full]
    assert sum(r["eligible"] for r in rows[2:]) > 0 and any(r["loss"] != 0 for r in rows[2:])
    cumulative = [r["cumulative_device_seconds"] for r in rows]  # carried across the resume
    assert all(a < b for a, b in zip(cumulative, cumulative[1:], strict=False))


def test_snapshots_carry_no_tensors_at_version_0_then_every_weight_packed(tmp_path):
    """Version 0 is the policy every role builds: its snapshot is empty (no receiver takes a
    version it holds). After a step, the snapshot holds every weight of the learner's model,
    bit for bit, packed (tied tensors once)."""
    cfg = load_config(WARM, ["pipeline.steps=1", f"run.output_dir={tmp_path}"])
    ex = LocalExecutor(cfg, tmp_path / "snap")
    version, (state,) = ex.snapshot()["solver"]
    assert version == 0 and len(state) == 0 and state.nbytes == 0
    ex.run()
    version, (state,) = ex.snapshot()["solver"]
    live = ex.learner.learner.state_dict_for_sync("solver")
    got = state.unpack()
    assert version == 1 and list(got) == list(live)
    assert all(torch.equal(got[k], v) for k, v in live.items())
