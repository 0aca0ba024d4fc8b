"""A Lean run of the local executor end to end: micro config's tiny random model, the stand-in
Lean REPL, task.domain=lean, reward cos x novelty against local references."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from compassplay.config import load_config
from compassplay.executors.local import LocalExecutor
from tests.executors.lean_script import propose, solve

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "verifiers" / "fake_lean_repl.py"
TARGETS = ROOT / "tests" / "envs" / "lean" / "targets.jsonl"
LEAN_FIELDS = ("coverage", "targets_proved", "targets_attempted", "copy_rate", "rename_rate",
               "eligible_reward_distinct")


def lean_cfg(steps: int, *extra: str):
    return load_config(ROOT / "compassplay" / "configs" / "micro.yaml", [
        "task.domain=lean", "task.types=[lean_prove]", f"task.lean.target_file={TARGETS}",
        f"verifiers.lean.command=[{sys.executable}, {FAKE}]", "verifiers.lean.processes=2",
        "reward.kind=cos_novelty", "reward.reference=local", f"pipeline.steps={steps}",
        "proposer.batch_size=2", "solver.n_samples=2", "solver.prefill=true",
        "proposer.prefill=true", "logging.progress=false", *extra])


def scripted(engine, tok, reply):
    """Keep the engine's sampled tokens (what the learner trains on), replace the text the
    stages parse by `reply(prompt_text, index)`."""
    real, real_each = engine.generate, engine.generate_each

    def rewrite(prompts, gens):
        return [g.model_copy(update={"text": reply(tok.decode(p), i)})
                for i, (p, g) in enumerate(zip(prompts, gens, strict=True))]
    engine.generate = lambda prompts, params: rewrite(prompts, real(prompts, params))
    engine.generate_each = lambda prompts, params: rewrite(prompts, real_each(prompts, params))


@pytest.mark.slow
def test_random_model_lean_run_writes_metrics(tmp_path):
    # the random model proves nothing: conjectures only with propose_before_proof
    ex = LocalExecutor(lean_cfg(2, "task.lean.propose_before_proof=true"), tmp_path / "lean")
    stats = ex.run()
    rows = [json.loads(x) for x in (tmp_path / "lean" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and len(stats) == 2
    for r in rows:
        assert all(r[k] is not None for k in LEAN_FIELDS)
        assert 0.0 <= r["coverage"] <= 1.0 and r["proposals"] == 2
        assert r["targets_attempted"] == 3 - r["targets_proved"]


@pytest.mark.slow
def test_scripted_lean_run_proves_targets_and_scores_locally(tmp_path):
    ex = LocalExecutor(lean_cfg(3), tmp_path / "lean")
    scripted(ex.proposer.engine, ex.proposer.tok, propose)
    scripted(ex.solver.engine, ex.solver.tok, solve)
    stats = ex.run()
    # iteration 0: no proved seed, so no conjectures; every target attempted, each proved
    assert (stats[0].proposals, stats[0].targets_attempted) == (0, 3)
    assert stats[0].coverage == pytest.approx(1.0) and stats[0].targets_proved == 3
    assert all(s.targets_attempted == 0 and s.coverage == 1.0 for s in stats[1:])
    later = stats[1:]
    assert all(s.valid == s.proposals == 2 for s in later)
    assert all(s.eligible == 2 for s in later)  # s = 1/2, a seed proof to align with
    assert all(s.copy_rate == 0.5 and s.rename_rate == 0.5 for s in later)
    samples = [json.loads(x) for x in
               (tmp_path / "lean" / "samples.jsonl").read_text().splitlines()]
    scored = [s for s in samples if s["step"] > 0]
    assert all(s["cosine"] is not None and -1.0 <= s["cosine"] <= 1.0 for s in scored)
    state = json.dumps(ex.proposer.env.state_dict())
    assert "by decide" in state
