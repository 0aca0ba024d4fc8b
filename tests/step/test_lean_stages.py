"""The Lean reward path with local references: stand-in REPL grading, candidates carrying their
seed's reference, scorer shards, merge, rewards per kind, Lean step metrics."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from compassplay.config import GRADIENT_KINDS, RewardSection, load_config
from compassplay.engines.training.learner import LearnerStats
from compassplay.envs.lean import LeanEnvironment
from compassplay.models import load_model
from compassplay.records import Task
from compassplay.rewards.batch import Example
from compassplay.rewards.functions import token_jaccard
from compassplay.rewards.oracle import flatten, per_example_grads, reference_grads
from compassplay.step import stages
from compassplay.step.graph import StageCall, WeightsOffer
from compassplay.step.messages import AttemptBatch, GradeBatch, Validated
from compassplay.step.prompting import candidate_examples
from compassplay.step.scoring import merge_shards
from compassplay.step.timing import Timing
from compassplay.verifiers.lean.repl_pool import LeanPool
from compassplay.workers.scorer_worker import ScorerWorker

ROOT = Path(__file__).resolve().parents[2]
FAKE = [sys.executable, str(ROOT / "tests" / "verifiers" / "fake_lean_repl.py")]
TARGETS = ROOT / "tests" / "envs" / "lean" / "targets.jsonl"
BASE = ["task.domain=lean", f"task.lean.target_file={TARGETS}", "scorer.max_batch_tokens=4096",
        "model.tiny.hidden_size=16", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
        "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=32"]
STATS = LearnerStats(loss=0.0, grad_norm=0.0, lr=0.0, clip_frac=0.0, kl=0.0, n_tokens=0,
                     weight_version=0)
# conjecture id -> (seed, accepted attempts of 4)
PLAN = {"c0": ("two_two", 2), "c1": ("add_zero", 1), "c2": ("two_two", 3),
        "c3": ("hard_one", 2), "c4": ("add_zero", 4)}


@pytest.fixture(scope="module")
def setup():
    cfg = load_config(None, BASE)
    with LeanPool(FAKE, processes=2, timeout_s=5.0, header_timeout_s=10) as pool:
        env = LeanEnvironment(cfg, pool)
        for name in ("two_two", "add_zero"):  # proved seeds (hard_one stays unproved)
            env.buffer.record(f"target:{name}", env.seed_of(f"target:{name}").statement
                              + " := by decide")
        tasks = []
        for i, (tid, (seed, _)) in enumerate(PLAN.items()):
            body = f"theorem q (n : ℕ) : n + {i} = {i} + n"
            tasks.append(env.parse_proposal("lean_prove", f"```lean\n{body} := by sorry\n```",
                                            [f"target:{seed}"], tid))
        tasks = env.validate(tasks)
        assert all(t.valid for t in tasks)
        attempts = [env.parse_attempt(t, "```lean\nby omega\n```" if k < PLAN[t.task_id][1]
                                      else "```lean\nby exact foo\n```", k)
                    for t in tasks for k in range(4)]
        verdicts = stages.grade(env, tasks, attempts)
        yield cfg, env, tasks, attempts, verdicts


_CACHE: dict = {}


def scored(setup, overrides, num_shards=1):
    key = (tuple(overrides), num_shards)
    if key not in _CACHE:
        _CACHE[key] = _scored(setup, overrides, num_shards)
    return _CACHE[key]


def _scored(setup, overrides, num_shards=1):
    _, _, tasks, attempts, verdicts = setup
    cfg = load_config(None, BASE + ["reward.reference=local", *overrides])
    workers = [ScorerWorker(cfg, i, num_shards) for i in range(num_shards)]
    cands = workers[0].candidates(StageCall("candidates", 0), Validated(0, tasks, [], Timing()),
                                  AttemptBatch(attempts, Timing()), [GradeBatch(verdicts, Timing())])
    shards = [w.score(StageCall("score", 0, i, num_shards), WeightsOffer(0, lambda: None), cands)
              for i, w in enumerate(workers)]
    return cfg, cands.cands, merge_shards(shards, cfg.scorer.shard_mode == "param_shard")[1]


@pytest.mark.slow
def test_local_alignment_exact_and_sharding_agrees(setup):
    cfg, cands, alignment = scored(setup, ["reward.kind=cosine"])
    # c3's seed has no proof: no local reference, not scored; c4 is always solved
    assert [c.task_id for c in cands] == ["c0", "c1", "c2"]
    assert cands[0].ref_prompt_ids == cands[2].ref_prompt_ids != cands[1].ref_prompt_ids
    model, _ = load_model(cfg.model, seed=0)
    params = dict(model.named_parameters())
    grads = per_example_grads(model, params, candidate_examples(cands))
    worst = 0.0
    for c, g in zip(cands, grads, strict=True):
        ref = flatten(reference_grads(model, params, [Example(c.ref_prompt_ids,
                                                              c.ref_target_ids)]))
        flat = flatten(g)
        cos, inner, norm = alignment[c.task_id]
        want = float(flat @ ref / (flat.norm() * ref.norm()))
        worst = max(worst, abs(cos - want))
        assert norm == pytest.approx(float(flat.norm()), rel=1e-5)
        assert inner == pytest.approx(float(flat @ ref), rel=1e-4, abs=1e-7)
    assert worst < 1e-5
    for over, n in [(["scorer.shard_mode=param_shard"], 2), (["scorer.shard_mode=replica"], 2)]:
        other = scored(setup, ["reward.kind=cosine", *over], n)[2]
        for tid, (cos, _, norm) in alignment.items():
            assert other[tid][0] == pytest.approx(cos, abs=1e-6)
            assert other[tid][2] == pytest.approx(norm, rel=1e-6)


@pytest.mark.parametrize("kind", ["difficulty", "cosine", "cos_novelty", "novelty"])
def test_rewards_with_local_references(setup, kind):
    _, env, tasks, _, verdicts = setup
    # cos_novelty scores the same candidates as cosine (the same alignment)
    _, cands, alignment = scored(setup, [f"reward.kind={kind.replace('cos_novelty', 'cosine')}"])
    rates = GradeBatch.merge([GradeBatch(verdicts, Timing())], tasks).rates
    bad = Task(task_id="p", task_type="lean_prove", invalid_reason="parse:no_lean_block")
    scores = {s.task_id: s for s in stages.assign_rewards(
        RewardSection(kind=kind, reference="local"), tasks + [bad], rates, cands, alignment)}
    assert scores["p"].reward == -1.0 and not scores["c4"].eligible
    gradient = kind in GRADIENT_KINDS
    assert [c.task_id for c in cands] == (["c0", "c1", "c2"] if gradient
                                          else ["c0", "c1", "c2", "c3"])
    for c in cands:
        nov = 1.0 - token_jaccard(c.novelty_tokens, c.seed_tokens)
        cos = alignment[c.task_id][0] if gradient else None
        want = {"difficulty": 1.0 - c.solve_rate, "cosine": cos, "novelty": nov,
                "cos_novelty": None if cos is None else cos * nov}[kind]
        assert scores[c.task_id].reward == pytest.approx(want, abs=1e-12)
    stats = stages.summarize(0, tasks, rates, [], verdicts, list(scores.values()),
                             STATS, {}, {"coverage": 0.5, **env.step_metrics(tasks, rates, [])})
    assert stats.coverage == 0.5 and stats.copy_rate == 0.0 and stats.rename_rate == 0.0
    assert stats.eligible_reward_distinct == len({round(s.reward, 12)
                                                  for s in scores.values() if s.eligible})
    assert stages.summarize(0, tasks, rates, [], verdicts, [], STATS, {}).coverage is None
