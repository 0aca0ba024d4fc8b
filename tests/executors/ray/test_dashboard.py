"""`make run`'s embedded Ray: the dashboard starts (on the next free port when the configured
one is taken), its URL is printed, and the run's step metrics reach Ray's metrics export with
`run` and `reward` tags. One test: starting a dashboard costs a process and seconds."""

from __future__ import annotations

import re
import socket
import time
import urllib.request
from pathlib import Path

import pytest
import ray

from compassplay.config import load_config
from compassplay.executors.ray.pipeline_runner import run_pipeline
from compassplay.executors.ray.session import init_ray

pytestmark = [pytest.mark.slow, pytest.mark.ray]

MICRO = Path(__file__).resolve().parents[3] / "compassplay" / "configs" / "micro.yaml"
FAST = ["proposer.batch_size=2", "solver.n_samples=2", "proposer.max_new_tokens=24",
        "solver.max_new_tokens=16", "logging.progress=false"]


def _get(url: str) -> int:
    req = urllib.request.Request(url)
    token = Path.home() / ".ray" / "auth_token"
    if token.is_file():  # Ray's token authentication (on by default for a local cluster)
        req.add_header("Authorization", f"Bearer {token.read_text().strip()}")
    return urllib.request.urlopen(req, timeout=10).status


def _exported(port: int, name: str, timeout_s: float = 60.0) -> list[str]:
    """The lines of Ray's metrics export (the node's metrics agent) for `name`."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        lines = [x for x in body.decode().splitlines() if x.startswith(name + "{")]
        if lines:
            return lines
        time.sleep(1.0)
    return []


def test_dashboard_starts_on_a_free_port_and_gets_the_run_metrics(tmp_path, monkeypatch,
                                                                   capsys):
    monkeypatch.setenv("COMPASSPLAY_RAY_DASHBOARD", "1")  # the suite turns it off elsewhere
    assert not ray.is_initialized()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = load_config(MICRO, FAST + ["pipeline.steps=2", f"cluster.dashboard_port={port}",
                                         "run.name=dash"])
        assert init_ray(cfg) is True
    try:
        printed = capsys.readouterr().out
        found = re.search(r"Ray dashboard: (http://127\.0\.0\.1:(\d+))", printed)
        assert found, printed
        assert port < int(found[2]) < port + 20
        assert _get(found[1] + "/api/version") == 200
        run_pipeline(cfg, tmp_path / "dash")
        agent = ray._private.worker.global_worker.node.metrics_export_port
        lines = _exported(agent, "ray_compassplay_reward_mean")
        assert lines, "the run's gauges never reached Ray's metrics export"
        assert any('run="dash"' in x and f'reward="{cfg.reward.kind}"' in x for x in lines)
        assert _exported(agent, "ray_compassplay_entropy")
    finally:
        ray.shutdown()
