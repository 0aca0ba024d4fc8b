"""Novelty against the closest shown reference (program and input; induction: inputs and
message), and the distinct-reward count over eligible candidates only."""

from __future__ import annotations

import keyword
import random
import re
from functools import partial

import pytest

from compassplay.config import TaskSection, load_config
from compassplay.engines.training.learner import LearnerStats
from compassplay.envs.code import CodeEnvironment
from compassplay.envs.code.copies import COPY_JACCARD
from compassplay.models import load_model
from compassplay.records import Score, Task
from compassplay.rewards.functions import regex_tokenize, token_jaccard
from compassplay.step import stages
from compassplay.step.prompting import novelty_tokens

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


def _reversed_names(text: str) -> str:
    """Every identifier of two or more characters spelled backwards: the same characters
    (bytes) as `text`, mostly different words."""
    return re.sub(r"[A-Za-z_]\w*", lambda m: m.group(0) if keyword.iskeyword(m.group(0))
                  or len(m.group(0)) < 2 else m.group(0)[::-1], text)


def test_copy_rate_counts_copies_on_the_tokens_novelty_uses(env):
    """The copy rate and the novelty factor compare the same tokens (reward.novelty_tokenizer):
    a proposal is a copy exactly when its novelty is below 1 - COPY_JACCARD."""
    _, tok = load_model(load_config(None).model, seed=0)  # byte tokens
    ref = env.buffer.pool("deduction")[0]
    ids = [ref.task_id]
    seed_text = env.novelty_text(ref)
    body, _, inp = _reversed_names(seed_text).rpartition("\n")
    task = _proposal(env, "deduction", ids, program=body, inputs=[inp])
    mine = env.novelty_text(task)
    # the premise: not a copy in regex words, a copy in model (byte) tokens
    assert token_jaccard(regex_tokenize(mine), regex_tokenize(seed_text)) <= COPY_JACCARD
    model = partial(novelty_tokens, tok, kind="model")
    assert token_jaccard(model(mine), model(seed_text)) > COPY_JACCARD
    new = _proposal(env, "deduction", ids, program="def f(q):\n    return q", inputs=["7"])
    tasks = [task.model_copy(update={"task_id": "c"}), new.model_copy(update={"task_id": "n"})]
    rates = {"c": 0.5, "n": 0.5}
    assert env.step_metrics(tasks, rates, [], model)["copy_rate"] == 0.5
    assert env.step_metrics(tasks, rates, [])["copy_rate"] == 0.0  # regex words: no copy
    for t in tasks:  # copy <=> novelty (as the reward computes it) below 1 - COPY_JACCARD
        nov = 1.0 - token_jaccard(*stages.candidate_novelty(env, tok, t, "model"))
        copied = env.step_metrics([t], {t.task_id: 0.5}, [], model)["copy_rate"] == 1.0
        assert copied == (nov < 1.0 - COPY_JACCARD)


@pytest.mark.parametrize("choice", ["closest", "first"])
def test_local_reference_comes_from_the_seed_novelty_compares_with(env, choice):
    refs = env.buffer.sample(3, random.Random(0), "deduction")
    ids = [t.task_id for t in refs]
    last = refs[-1]  # the proposal copies the last shown seed, not the first
    task = env.parse_proposal(
        "deduction", f"```python\n{last.program}\n```\n```input\n{last.inputs[0]}\n```",
        ids, "p0")
    assert task.seed_statement == env.seed_reference("deduction", ids[0])["seed_statement"]
    cfg = load_config(None, ["reward.kind=cosine", "reward.reference=local",
                             "reward.novelty_tokenizer=regex",
                             f"reward.local_reference_seed={choice}"])
    shown = [(sid, text) for sid in ids for text in env.reference_texts("deduction", [sid])]
    task = task.model_copy(update={"seed_texts": [text for _, text in shown]})
    picked = stages._local_reference_seed(env, None, cfg, task, shown)
    want = ids[-1] if choice == "closest" else ids[0]
    assert picked.seed_statement == env.seed_reference("deduction", want)["seed_statement"]
    assert picked.seed_solution == env.seed_reference("deduction", want)["seed_solution"]
    # the seed novelty scores against is the one the reference comes from
    _, closest = stages.candidate_novelty(env, None, task, "regex")
    assert closest == regex_tokenize(env.reference_texts("deduction", [ids[-1]])[0])
