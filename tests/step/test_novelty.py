"""Novelty against the closest shown reference (program and input; induction: inputs and
message), and the distinct-reward count over eligible candidates only."""

from __future__ import annotations

import random

import pytest

from compassplay.config import TaskSection
from compassplay.engines.learner import LearnerStats
from compassplay.envs.code import CodeEnvironment
from compassplay.records import Score, Task
from compassplay.rewards.functions import token_jaccard
from compassplay.step import stages

STATS = LearnerStats(0.0, 0.0, 0.0, 0.0, 0.0, 0, 0)


@pytest.fixture(scope="module")
def env():
    return CodeEnvironment(TaskSection(types=["deduction", "abduction", "induction"]), None)


def _proposal(env, task_type, seed_ids, **fields):
    first = env.seed_of(seed_ids[0])
    return Task(task_id="x", task_type=task_type, seed_ids=seed_ids, valid=True,
                seed_program=first.program,
                seed_texts=env.reference_texts(task_type, seed_ids), **fields)


def _novelty(env, task, kind="regex"):
    mine, ref = stages.candidate_novelty(env, None, task, kind)
    return 1.0 - token_jaccard(mine, ref)


def test_induction_proposal_with_new_inputs_is_novel(env):
    seed = env.buffer.pool("induction")[0]
    same = _proposal(env, "induction", [seed.task_id], program=seed.program,
                     inputs=list(seed.inputs), message=seed.message)
    assert _novelty(env, same) == 0.0  # the seed's own pairs and message: a copy
    new = same.model_copy(update={"inputs": ["[101, 202]", "'zzz'", "(7, 8)"],
                                  "message": "Reverse and double every element."})
    assert _novelty(env, new) > 0.5  # the program is given; new inputs and message are novel


def test_copy_of_any_shown_reference_has_zero_novelty(env):
    refs = env.buffer.sample(3, random.Random(0), "deduction")
    ids = [t.task_id for t in refs]
    for ref in refs:  # not only the first reference shown
        copy = _proposal(env, "deduction", ids, program=ref.program, inputs=list(ref.inputs))
        assert _novelty(env, copy) == 0.0
    # the same program on a new input is not a copy: the input counts too
    last = refs[-1]
    moved = _proposal(env, "deduction", ids, program=last.program,
                      inputs=["'a brand new input', 12345"])
    assert 0.0 < _novelty(env, moved) < 1.0


def test_distinct_rewards_count_eligible_candidates_only():
    tasks = [Task(task_id=f"t{i}", task_type="deduction", valid=i > 1) for i in range(5)]
    scores = [Score(task_id="t0", reward=-1.0, kind="cosine", eligible=False, solve_rate=0.0),
              Score(task_id="t1", reward=-0.5, kind="cosine", eligible=False, solve_rate=0.0),
              Score(task_id="t2", reward=0.0, kind="cosine", eligible=False, solve_rate=1.0),
              Score(task_id="t3", reward=0.25, kind="cosine", eligible=True, solve_rate=0.5),
              Score(task_id="t4", reward=0.5, kind="cosine", eligible=True, solve_rate=0.5)]
    stats = stages.summarize(0, tasks, {}, [], [], scores, STATS, {})
    assert stats.reward_distinct == 2
