"""SGS's iteration on the Lean environment: the prover attempts every unsolved target (or a
sample, task.lean.targets_per_iteration), the proposer conditions only on proved targets (the
seed's verified proof is g_ref; task.lean.propose_before_proof opts out), checks go to the pool
in chunks with progress lines, and coverage counts land in the step's metrics."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

from compassplay.config import ConfigError, load_config
from compassplay.engines.generation.base import GenerationEngine, SamplingParams
from compassplay.engines.training.learner import LearnerStats
from compassplay.envs.lean.chunked import check_in_chunks
from compassplay.models.byte_tokenizer import build_byte_tokenizer
from compassplay.records import Attempt, Generation, Verdict
from compassplay.step import stages
from compassplay.verifiers.lean.repl_pool import LeanCheck
from compassplay.verifiers.lean.responses import LeanVerdict
from compassplay.workers.builders import make_env

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ROOT / "tests" / "envs" / "lean" / "targets.jsonl"
ALL = ["target:add_zero", "target:two_two", "target:hard_one"]
STATS = LearnerStats(loss=0.0, grad_norm=0.0, lr=0.0, clip_frac=0.0, kl=0.0, n_tokens=0,
                     weight_version=0)


class Conjecturer(GenerationEngine):
    """Every reply is the same well-formed conjecture."""

    weight_version = 0

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        return [Generation(prompt_ids=p, completion_ids=[65], logprobs=[-1.0],
                           text="```lean\ntheorem q (n : ℕ) : n + 1 = 1 + n := by sorry\n```")
                for p in prompts]

    def load_weights(self, state, version: int) -> None:  # pragma: no cover - unused
        raise AssertionError


def lean(*extra: str):
    cfg = load_config(None, ["task.domain=lean", f"task.lean.target_file={TARGETS}",
                             "proposer.batch_size=2", "solver.seed_tasks_per_step=1", *extra])
    return cfg, make_env(cfg, None)


def propose(cfg, env, step: int = 0):
    return stages.propose(env, Conjecturer(), build_byte_tokenizer(), cfg, step)


def prompt_text(task) -> str:
    return build_byte_tokenizer().decode(task.proposal.prompt_ids)


def test_every_unsolved_target_each_iteration_and_proved_seeds_only():
    cfg, env = lean()
    assert cfg.task.lean.targets_per_iteration == "all"
    first = propose(cfg, env)
    # no target proved yet: no seed with a verified proof, so no conjectures this iteration
    assert first.tasks == [] and not env.can_propose("lean_prove")
    assert [t.task_id for t in first.seed_tasks] == ALL  # all of them, not seed_tasks_per_step
    with pytest.raises(RuntimeError, match="no proved target"):
        env.proposer_prompt("lean_prove", random.Random(0))
    env.buffer.record("target:two_two", "theorem two_two : (2 : ℕ) + 2 = 4 := by decide")
    later = propose(cfg, env, 1)
    assert [t.task_id for t in later.seed_tasks] == ["target:add_zero", "target:hard_one"]
    assert len(later.tasks) == 2 and not any(t.invalid_reason for t in later.tasks)
    for t in later.tasks:
        assert t.seed_ids == ["target:two_two"] and t.seed_solution.endswith("by decide")
        assert env.local_reference(t) is not None and "it has proved" in prompt_text(t)


def test_a_sample_of_targets_when_configured():
    cfg, env = lean("task.lean.targets_per_iteration=2")
    assert cfg.task.lean.targets_per_iteration == 2
    drawn = [t.task_id for t in propose(cfg, env).seed_tasks]
    assert len(drawn) == len(set(drawn)) == 2 and set(drawn) <= set(ALL)
    for bad in ("0", "-1", "some"):
        with pytest.raises(ConfigError, match="targets_per_iteration"):
            lean(f"task.lean.targets_per_iteration={bad}")


def test_propose_before_proof_shows_an_unsolved_target_without_a_reference():
    cfg, env = lean("task.lean.propose_before_proof=true")
    props = propose(cfg, env)
    assert len(props.tasks) == 2 and env.can_propose("lean_prove")
    for t in props.tasks:
        assert t.seed_ids[0] in ALL and t.seed_solution == ""
        assert env.local_reference(t) is None  # no g_ref: gradient kinds leave it unscored
        assert "not proved yet" in prompt_text(t) and "verified proof" not in prompt_text(t)


def test_coverage_counts_reach_the_step_metrics():
    cfg, env = lean()
    targets = propose(cfg, env).seed_tasks
    attempts = [Attempt(task_id=t.task_id, index=0, answer=t.statement + " := by decide")
                for t in targets]
    verdicts = [Verdict(task_id=t.task_id, index=0, correct=t.task_id != "target:hard_one",
                        status="ok") for t in targets]
    out = env.record_results(targets, attempts, verdicts)
    assert out["targets_attempted"] == 3 and out["targets_proved"] == 2
    assert out["coverage"] == pytest.approx(2 / 3)
    again = env.record_results(targets[:1], attempts[:1], verdicts[:1])  # already proved
    assert again["targets_proved"] == 2 and again["new_proofs"] == 0
    stats = stages.summarize(0, [], {}, attempts, verdicts, [], STATS, {}, out)
    assert (stats.coverage, stats.targets_proved, stats.targets_attempted) == (
        pytest.approx(2 / 3), 2, 3)
    assert stats.proposals == 0


class CountingPool:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def check_many(self, requests):
        self.calls.append(len(requests))
        return [LeanVerdict(r.code.endswith("ok"), "accepted" if r.code.endswith("ok")
                            else "error", [], 0) for r in requests]


def test_checks_go_in_chunks_in_order_with_progress(caplog):
    pool = CountingPool()
    checks = [LeanCheck(f"theorem t{i} : True := {'ok' if i % 3 else 'no'}") for i in range(10)]
    with caplog.at_level(logging.INFO, logger="compassplay.envs.lean.chunked"):
        verdicts = check_in_chunks(pool, checks, 4, "grading")
    assert pool.calls == [4, 4, 2]
    assert [v.accepted for v in verdicts] == [bool(i % 3) for i in range(10)]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and lines[-1].startswith("Lean grading: 10/10 checks (accepted 6, "
                                                    "error 4)")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="compassplay.envs.lean.chunked"):
        assert len(check_in_chunks(pool, checks, 10, "grading")) == 10
    assert pool.calls[-1] == 10 and not caplog.records  # one chunk: no progress lines
    assert check_in_chunks(pool, [], 4, "grading") == [] and pool.calls[-1] == 10
