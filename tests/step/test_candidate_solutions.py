"""Candidates carry every verified solution (task.verified_solution=attempts, the default) and
the production scoring path scores g(x) = the mean of the per-solution gradients, exactly,
unsharded or over parameter shards."""

from __future__ import annotations

import pytest

from compassplay.config import load_config
from compassplay.models import load_model
from compassplay.records import Generation, Verdict
from compassplay.rewards.oracle import flatten, per_example_grads, reference_grads
from compassplay.rewards.reference_set import load_reference
from compassplay.step import stages
from compassplay.step.graph import StageCall, WeightsOffer
from compassplay.step.messages import AttemptBatch, GradeBatch, Validated
from compassplay.step.prompting import reference_examples
from compassplay.step.scoring import candidate_solutions, merge_shards
from compassplay.step.timing import Timing
from compassplay.workers.builders import make_env
from compassplay.workers.scorer_worker import ScorerWorker

BASE = ["task.types=[deduction]", "reference.max_items=3", "reward.kind=cosine"]


def case(overrides=()):
    """Two proposed tasks: p0 with 3 of 4 attempts right (two texts, one repeated), p1 with 1."""
    cfg = load_config(None, [*BASE, *overrides])
    env = make_env(cfg, None)
    seeds = env.buffer.pool("deduction")[:2]
    tasks = [t.model_copy(update={"task_id": f"p{i}", "source": "proposed", "valid": True})
             for i, t in enumerate(seeds)]
    right = {"p0": [0, 1, 3], "p1": [2]}
    attempts, verdicts = [], []
    for t in tasks:
        gold = env.gold_answer_text(t)
        texts = [gold, "The function returns its input.\n" + gold, "```output\n'no'\n```", gold]
        for i, text in enumerate(texts):
            gen = Generation(prompt_ids=[1], completion_ids=[2], logprobs=[-1.0], text=text)
            att = env.parse_attempt(t, text, i).model_copy(update={"generation": gen})
            attempts.append(att)
            verdicts.append(Verdict(task_id=t.task_id, index=i, correct=i in right[t.task_id]))
    return cfg, env, tasks, attempts, verdicts


def build(overrides=()):
    cfg, env, tasks, attempts, verdicts = case(overrides)
    _, tok = load_model(cfg.model, seed=0)
    rates = GradeBatch.merge([GradeBatch(verdicts, Timing())], tasks).rates
    return stages.build_candidates(env, tok, cfg, tasks, attempts, verdicts, rates), tok, attempts


def test_build_candidates_keeps_every_verified_attempt():
    cands, tok, attempts = build()
    by = {c.task_id: c for c in cands}
    assert by["p0"].solve_rate == 0.75 and by["p1"].solve_rate == 0.25
    texts = [a.generation.text for a in attempts if a.task_id == "p0"]
    got = [tok.decode(t[:-1]) for t in by["p0"].solutions]
    assert got == [texts[0], texts[1], texts[3]]  # attempt order, the repeat kept
    assert by["p0"].target_ids == by["p0"].solutions[0] and len(by["p0"].more_target_ids) == 2
    assert len(by["p1"].solutions) == 1 and by["p1"].more_target_ids == []
    first, _, _ = build(["task.verified_solution=attempt"])
    assert [len(c.solutions) for c in first] == [1, 1]
    assert first[0].target_ids == by["p0"].target_ids
    gold, _, _ = build(["task.verified_solution=gold"])
    assert [len(c.solutions) for c in gold] == [1, 1]


def scored(overrides, num_shards):
    cfg, _, tasks, attempts, verdicts = case(overrides)
    workers = [ScorerWorker(cfg, i, num_shards) for i in range(num_shards)]
    cands = workers[0].candidates(StageCall("candidates", 0), Validated(0, tasks, [], Timing()),
                                  AttemptBatch(attempts, Timing()),
                                  [GradeBatch(verdicts, Timing())])
    shards = [w.score(StageCall("score", 0, i, num_shards), WeightsOffer(0, lambda: None), cands)
              for i, w in enumerate(workers)]
    return cfg, cands.cands, merge_shards(shards, cfg.scorer.shard_mode == "param_shard")[1]


@pytest.mark.parametrize("overrides,shards", [((), 1), (("scorer.shard_mode=param_shard",), 2),
                                              (("scorer.mode=naive",), 1)])
def test_scoring_path_matches_the_mean_gradient_oracle(overrides, shards):
    cfg, cands, alignment = scored(list(overrides), shards)
    assert [len(c.solutions) for c in cands] == [3, 1]
    model, tok = load_model(cfg.model, seed=0)
    params = dict(model.named_parameters())
    ref = flatten(reference_grads(model, params, reference_examples(
        tok, load_reference(max_items=3))))
    sols = candidate_solutions(cands)
    for c, g in zip(cands, per_example_grads(model, params, sols), strict=True):
        flat = flatten(g)
        cos, inner, norm = alignment[c.task_id]
        assert cos == pytest.approx(float(flat @ ref / (flat.norm() * ref.norm())), abs=1e-4)
        assert norm == pytest.approx(float(flat.norm()), rel=1e-4)
        assert inner == pytest.approx(float(flat @ ref), rel=1e-3, abs=1e-7)
    # p0's score is not its first solution's
    only = flatten(next(per_example_grads(model, params, [sols[0][0]])))
    assert abs(alignment["p0"][2] - float(only.norm())) > 1e-3 * float(only.norm())
