"""`ray job submit` onto a multi-node cluster grown by Ray's autoscaler (issue 31, part 4):
deploy/submit_job.sh uploads the working dir, the job's driver runs `compassplay run` on the
head, the autoscaler launches the node types the run asks for while it starts (the nodes that
unpack the uploaded package after the job began), the job succeeds with its progress in
`ray job logs`; a second job stopped by `ray job stop` ends cleanly (the run's own stop message,
within the grace submit_job.sh sets), leaves no actor alive, and the autoscaler removes every
worker node."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import ray
from ray.util.state import list_actors

from compassplay.bench.fake_cluster import ray_cli, wait_for
from compassplay.bench.fake_node_types import HEAD_TYPE, alive_nodes_by_type
from tests.deploy.test_job_submit import _env, _job_status

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(600)]

CLUSTER_DASHBOARD = True  # the Jobs API (tests/cluster/conftest.py)
REPO = Path(__file__).resolve().parents[2]
# the warm micro run placed by node type, small enough for one fake node of each type
SHAPE = ["proposer.batch_size=2", "solver.n_samples=4", "solver.seed_tasks_per_step=1",
         "logging.progress=false"]


def _submit(url: str, job_id: str, *overrides: str) -> None:
    env = _env() | {"RAY_ADDRESS": url, "RAY_BIN": ray_cli(), "CONFIG": "cluster_local",
                     "NO_WAIT": "1", "JOB_ID": job_id}
    # submit_job.sh retries while the head's job agent is not up yet (AGENT_WAIT_S)
    sub = subprocess.run(["bash", str(REPO / "deploy" / "submit_job.sh"), *SHAPE, *overrides],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert sub.returncode == 0, sub.stdout + sub.stderr


def _logs(url: str, job_id: str) -> str:
    with urllib.request.urlopen(f"{url}/api/jobs/{job_id}/logs", timeout=10) as r:
        return json.loads(r.read())["logs"]


def _wait_status(url: str, job_id: str, want: set[str], timeout_s: float) -> str:
    status = {"s": "PENDING"}

    def done() -> bool:
        status["s"] = _job_status(url, job_id)
        return status["s"] in want | {"SUCCEEDED", "FAILED", "STOPPED"}

    try:
        wait_for(f"job {job_id} {'/'.join(sorted(want))}", done, timeout_s, poll_s=2)
    except TimeoutError:
        pytest.fail(f"job {job_id} still {status['s']} after {timeout_s:.0f} s:\n"
                    + _logs(url, job_id)[-6000:])
    return status["s"]


def _worker_nodes(cluster) -> dict[str, int]:
    return {t: n for t, n in alive_nodes_by_type(ray.nodes(), cluster.node_types).items()
            if t != HEAD_TYPE}


def test_a_job_runs_on_nodes_the_autoscaler_adds_and_ray_job_stop_leaves_nothing(
        fake_cluster, tmp_path):
    url = fake_cluster.dashboard_url
    wait_for("the Jobs API", lambda: _jobs_api_up(url), 90)
    wait_for("no worker node", lambda: not _worker_nodes(fake_cluster), 60)
    out = tmp_path / "runs"

    # 1. a 2-step job from zero worker nodes: its demand launches the node types
    job = f"cp-ok-{uuid.uuid4().hex[:6]}"
    _submit(url, job, "pipeline.steps=2", "run.name=ok", f"run.output_dir={out}")
    status = _wait_status(url, job, {"SUCCEEDED"}, 420)
    logs = _logs(url, job)
    assert status == "SUCCEEDED", logs[-6000:]
    assert "step 0: valid=" in logs and "step 1: valid=" in logs, logs[-4000:]
    assert f"run finished: {out / 'ok'}" in logs
    assert "ModuleNotFoundError" not in logs
    rows = [json.loads(x) for x in (out / "ok" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("kind", "step") == "step"] == [0, 1]
    placed = json.loads((out / "ok" / "placement.json").read_text())
    kinds = {role: loc.get("node_type") for role, loc in placed.items()}
    assert kinds["learner"] == kinds["scorer-0"] == "gpu_worker", kinds
    assert kinds["verifier-0"] == "python_verifier", kinds
    # each node that ran the job (the head, the nodes added while it started) unpacked the
    # one uploaded package into its own runtime-env folder (fake_cluster.OWN_RUNTIME_DIRS)
    pkgs = list(fake_cluster.temp_dir.glob(
        "session_*/runtime_resources*/working_dir_files/_ray_pkg_*/"))
    listed = [str(p.relative_to(fake_cluster.temp_dir)) for p in pkgs]
    assert len({p.name for p in pkgs}) == 1, listed  # one upload
    for node in {loc["node_id"] for loc in placed.values()}:
        assert any(p.parents[1].name == f"runtime_resources_{node}" for p in pkgs), listed
    for pkg in pkgs:
        size = sum(f.stat().st_size for f in pkg.rglob("*") if f.is_file())
        assert size < 20 * 2**20, f"working_dir upload is {size / 2**20:.1f} MiB"
        assert not (pkg / ".venv").exists() and not (pkg / ".git").exists()

    # 2. a long job stopped after its first step: a clean stop, no actor left, no node left
    long_job = f"cp-stop-{uuid.uuid4().hex[:6]}"
    _submit(url, long_job, "pipeline.steps=50", "run.name=stopped", f"run.output_dir={out}")
    wait_for("the long job's first step", lambda: "step 0: valid=" in _logs(url, long_job)
             or _job_status(url, long_job) in ("FAILED", "STOPPED", "SUCCEEDED"), 420, poll_s=2)
    assert _job_status(url, long_job) == "RUNNING", _logs(url, long_job)[-6000:]
    assert _worker_nodes(fake_cluster), "the running job holds no worker node"
    stopped_at = time.monotonic()
    done = subprocess.run([ray_cli(), "job", "stop", "--address", url, long_job], env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _wait_status(url, long_job, {"STOPPED"}, 90) == "STOPPED"
    logs = _logs(url, long_job)
    assert "run interrupted; the last checkpoint is kept" in logs, logs[-4000:]
    wait_for("no actor alive", lambda: not list_actors(address=url,
                                                       filters=[("state", "=", "ALIVE")]), 60)
    removed_s = wait_for("every worker node removed", lambda: not _worker_nodes(fake_cluster),
                         120)
    print(f"job stop -> no worker node: {time.monotonic() - stopped_at:.1f} s "
          f"(last wait {removed_s:.1f} s)")


def _jobs_api_up(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/version", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False
