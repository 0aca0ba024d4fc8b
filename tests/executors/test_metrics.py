"""The run's Prometheus endpoint, scraped over HTTP on 127.0.0.1: `run` and `reward` labels
on every series, a taken port gives the next free one (two jobs on one node), verifier runs
are counters, and the local executor serves the same metrics while it runs."""

from __future__ import annotations

import logging
import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from compassplay.config import load_config
from compassplay.errors import RunError
from compassplay.executors.metrics import PORT_TRIES, RunMetrics
from compassplay.records import StepStats

ROOT = Path(__file__).resolve().parents[2]
MICRO = ROOT / "compassplay" / "configs" / "micro.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> dict[str, list]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def _stats(step: int) -> StepStats:
    return StepStats(step=step, weight_version=step + 1, proposals=4, valid=3, eligible=2,
                     solve_rate_mean=0.5, reward_mean=0.125, reward_std=0.0, reward_distinct=1,
                     loss=0.5, grad_norm=1.0, solver_accuracy=0.5, solve_rates=[0.5],
                     stage_seconds={"propose": 0.5})


def test_every_series_carries_run_and_reward_labels():
    m = RunMetrics(run="alpha", reward="cosine")
    port = m.serve(_free_port())
    try:
        m.observe_step(_stats(3))
        samples = _scrape(port)
    finally:
        m.close()
    mine = [s for name, ss in samples.items() if name.startswith("compassplay_") for s in ss]
    assert mine and all(s.labels.get("run") == "alpha" and s.labels.get("reward") == "cosine"
                        for s in mine)
    assert [s.value for s in samples["compassplay_step"]] == [3.0]
    assert [s.value for s in samples["compassplay_proposals_total"]] == [4.0]
    with pytest.raises(OSError):  # closed: the port is free again
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_a_taken_port_gives_the_next_free_one(caplog):
    port = _free_port()
    first, second = RunMetrics(run="a"), RunMetrics(run="b")
    try:
        assert first.serve(port) == port
        with caplog.at_level(logging.WARNING, logger="compassplay.executors.metrics"):
            got = second.serve(port)  # a second job on the same head node
        assert got != port and port < got < port + PORT_TRIES
        assert f"prometheus port {port} is taken" in caplog.text and str(got) in caplog.text
        assert _scrape(port)["compassplay_step"][0].labels["run"] == "a"
        assert _scrape(got)["compassplay_step"][0].labels["run"] == "b"
    finally:
        first.close()
        second.close()


def test_no_free_port_is_a_clear_error(monkeypatch):
    import compassplay.executors.metrics as metrics

    monkeypatch.setattr(metrics, "PORT_TRIES", 1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(RunError, match=r"logging\.prometheus_port: ports"):
            RunMetrics().serve(s.getsockname()[1])


def test_verifier_runs_are_counters_of_cumulative_snapshots():
    m = RunMetrics(run="r")
    m.observe_verifiers({"v0": {"counts": {"ok": 3}, "runs_total": 3}}, 1.0)
    m.observe_verifiers({"v0": {"counts": {"ok": 5, "timeout": 1}, "runs_total": 6}}, 2.0)
    m.observe_verifiers({"v0": {"counts": {"ok": 1}, "runs_total": 1}}, 3.0)  # restarted
    fam = {f.name: f for f in m.registry.collect()}
    assert fam["compassplay_verifier_runs"].type == "counter"
    get = m.registry.get_sample_value
    assert get("compassplay_verifier_runs_total", {"status": "ok"}) == 6.0
    assert get("compassplay_verifier_runs_total", {"status": "timeout"}) == 1.0
    assert get("compassplay_verifier_actor_runs_total", {"actor": "v0"}) == 7.0


def test_the_local_executor_serves_prometheus(tmp_path):
    from compassplay.executors.local import LocalExecutor

    port = _free_port()
    cfg = load_config(MICRO, ["pipeline.steps=2", f"logging.prometheus_port={port}",
                              "logging.progress=false", "run.name=local-prom"])
    seen: list[tuple[int, float, dict]] = []

    def scrape(stats: StepStats) -> None:  # during the run, after each step
        s = _scrape(port)["compassplay_step"][0]
        seen.append((stats.step, s.value, s.labels))

    LocalExecutor(cfg, tmp_path / "run").run(scrape)
    assert [(a, b) for a, b, _ in seen] == [(0, 0.0), (1, 1.0)]
    assert seen[0][2]["run"] == "local-prom" and seen[0][2]["reward"] == cfg.reward.kind
