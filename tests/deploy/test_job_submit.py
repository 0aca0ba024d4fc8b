"""`ray job submit` of a micro run to a real local Ray cluster started with `ray start --head`
--num-cpus=2 (what a 2-core laptop offers: the micro config must fit it, not wait forever).

This is what a user does against a real cluster (deploy/submit_job.sh), scaled down: the job's
driver runs `compassplay run` inside the cluster and connects through RAY_ADDRESS.

Isolation from other Ray instances on the machine (parallel tests, a user's own cluster):
every port is a free one, the temp dir is unique, and teardown ends only this cluster's
processes, by pid (`ray stop` would end every Ray process of the machine). RAY_AUTH_MODE is set
to `disabled` for this throwaway 127.0.0.1 cluster so the test neither needs nor creates a
token in ~/.ray (recent Ray enables token auth by default for new local clusters).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(360)]

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
RAY = VENV_BIN / "ray"
JOB_TIMEOUT_S = 240


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["RAY_AUTH_MODE"] = "disabled"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env.pop("RAY_ADDRESS", None)
    return env


def _ours(temp_dir: str) -> list[psutil.Process]:
    """Processes whose command line names our unique temp dir (gcs, raylet, dashboard...)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(temp_dir in part for part in p.info["cmdline"] or []):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _stop_cluster(head: subprocess.Popen, temp_dir: str) -> None:
    """End `ray start --block` (it stops the processes it started), then any leftover of ours."""
    try:
        procs = psutil.Process(head.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        procs = []
    procs += _ours(temp_dir)
    if head.poll() is None:
        head.terminate()
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait(timeout=10)
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive + _ours(temp_dir):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=10)


@pytest.fixture
def ray_cluster():
    """A real single-node cluster: `ray start --head --block`; yields (dashboard URL, temp dir)."""
    gcs, dash, client, agent = _free_ports(4)
    temp_dir = tempfile.mkdtemp(prefix="cpjob", dir="/tmp")
    log = open(Path(temp_dir) / "ray_start.log", "w")  # closed in teardown
    cmd = [str(RAY), "start", "--head", "--block", f"--port={gcs}", "--num-cpus=2",
           "--num-gpus=0", "--node-ip-address=127.0.0.1", "--include-dashboard=true",
           "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
           f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}",
           "--disable-usage-stats", f"--temp-dir={temp_dir}"]
    head = subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if head.poll() is not None:
                pytest.fail(f"ray start exited {head.returncode}:\n"
                            + (Path(temp_dir) / "ray_start.log").read_text()[-4000:])
            try:
                with urllib.request.urlopen(f"{url}/api/version", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("the Ray dashboard did not come up in 90 s")
            time.sleep(1)
        yield url, Path(temp_dir)
    finally:
        _stop_cluster(head, temp_dir)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _ray(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(RAY), *args], env=_env(), cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def _job_status(url: str, job_id: str) -> str:
    """SUCCEEDED | FAILED | STOPPED | RUNNING | PENDING, from the Jobs REST API."""
    with urllib.request.urlopen(f"{url}/api/jobs/{job_id}", timeout=10) as r:
        return json.loads(r.read())["status"]


def test_ray_job_submit_micro_run(ray_cluster, tmp_path):
    url, temp_dir = ray_cluster
    assert shutil.which("compassplay", path=_env()["PATH"]), "compassplay not on the job's PATH"
    name = f"job-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "runs"
    job_id = f"compassplay-test-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    # deploy/submit_job.sh runs: ray job submit --address $RAY_ADDRESS --working-dir .
    #   --runtime-env-json '{"excludes": [...]}' --no-wait --submission-id $JOB_ID
    #   -- compassplay run --config $CONFIG "$@"
    env = _env() | {"RAY_ADDRESS": url, "RAY_BIN": str(RAY), "CONFIG": "micro",
                     "NO_WAIT": "1", "JOB_ID": job_id}
    sub = subprocess.run(["bash", str(REPO / "deploy" / "submit_job.sh"), "pipeline.steps=2",
                          f"run.name={name}", f"run.output_dir={out}"],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    assert "Uploading package" in sub.stdout + sub.stderr, sub.stdout + sub.stderr

    status = "PENDING"
    while time.monotonic() - started < JOB_TIMEOUT_S:
        status = _job_status(url, job_id)
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        time.sleep(2)
    if status != "SUCCEEDED":
        logs = _ray("job", "logs", "--address", url, job_id)
        if status not in ("FAILED", "STOPPED"):
            _ray("job", "stop", "--address", url, "--no-wait", job_id)
        pytest.fail(f"job {job_id} ended {status}:\n{logs.stdout[-6000:]}{logs.stderr[-2000:]}")

    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    logs = _ray("job", "logs", "--address", url, job_id)
    assert f"run finished: {out / name}" in logs.stdout

    # The uploaded working dir must stay small: no .venv, runs/ or .git in it.
    pkgs = list(temp_dir.glob("session_*/runtime_resources/working_dir_files/_ray_pkg_*/"))
    assert pkgs, "no unpacked working_dir package found"
    for pkg in pkgs:
        size = sum(f.stat().st_size for f in pkg.rglob("*") if f.is_file())
        assert size < 20 * 2**20, f"working_dir upload is {size / 2**20:.1f} MiB"
        assert not (pkg / ".venv").exists() and not (pkg / ".git").exists()
