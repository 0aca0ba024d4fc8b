"""Kill the driver of a Ray run mid-way (SIGKILL, whole process group), then --resume it."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.ray]

ROOT = Path(__file__).resolve().parents[3]


def _run(args, **kw):
    env = {**os.environ, "RAY_ADDRESS": ""}
    env.pop("RAY_ADDRESS")
    return subprocess.Popen([sys.executable, "-m", "compassplay.cli", "run", *args], cwd=ROOT,
                            env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def test_driver_killed_then_resumed_completes_every_step_once(tmp_path):
    run_dir = tmp_path / "killed"
    args = ["--config", "configs/micro.yaml", "pipeline.steps=5", "learner.checkpoint_every=1",
            "proposer.batch_size=2", "solver.n_samples=2", "logging.progress=false",
            "run.name=killed", f"run.output_dir={tmp_path}"]
    proc = _run(args)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.stdout.read()[-3000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    done_before = len(metrics.read_text().splitlines())
    assert 2 <= done_before < 5
    resumed = _run(["--resume", str(run_dir)])
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out[-3000:]
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    versions = [r["weight_version"] for r in rows]
    assert versions == sorted(versions) and len(set(versions)) == 5
    assert "resumed" in (run_dir / "run.log").read_text() or "step 4" in out
