"""learner.frozen_states end to end on the micro config (local executor, real tiny model and
sandbox): the proposer's and solver's decoders keep the states entering the learner's lowest
trained block, the learner starts from them, and the run's samples and updates are those of
the run that recomputes every block."""

import json
from pathlib import Path

import pytest

from compassplay.config import load_config
from compassplay.executors.local import LocalExecutor

MICRO = Path(__file__).resolve().parents[2] / "compassplay" / "configs" / "micro.yaml"


def _run(tmp_path: Path, mode: str) -> tuple[list[dict], str]:
    cfg = load_config(MICRO, ["pipeline.steps=2", "learner.trainable=last:1",
                              f"learner.frozen_states={mode}", "proposer.batch_size=2",
                              "solver.seed_tasks_per_step=1"])
    run = tmp_path / mode
    LocalExecutor(cfg, run).run()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return rows, (run / "run.log").read_text()


def test_the_learner_starts_from_the_generators_states_with_the_same_updates(tmp_path):
    plain, plain_log = _run(tmp_path, "recompute")
    handed, log = _run(tmp_path, "auto")
    assert "forwards start at layer 1 from the generators' states" in log
    assert "forwards start" not in plain_log
    for a, b in zip(plain, handed, strict=True):
        assert (a["valid"], a["eligible"], a["proposals"]) == \
            (b["valid"], b["eligible"], b["proposals"])
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
        assert b["reward_mean"] == pytest.approx(a["reward_mean"], rel=1e-4, abs=1e-6)
