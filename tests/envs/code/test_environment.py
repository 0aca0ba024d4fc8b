"""End-to-end use of the environment API, solver rewards and verified solutions."""

from __future__ import annotations

import random

import pytest

from compassplay.config import TaskSection
from compassplay.envs.code import CodeEnvironment, CodeRunner
from compassplay.records import Attempt, Generation, Task, Verdict


def test_runner_protocol(runner):
    assert isinstance(runner, CodeRunner)


@pytest.mark.parametrize("fmt", ["fenced", "think_answer"])
@pytest.mark.parametrize("tt", ["deduction", "abduction", "induction"])
def test_round_trip_gold_answers(runner, fmt, tt):
    """proposer prompt -> proposal -> validate -> solver prompt -> gold answer grades correct."""
    env = CodeEnvironment(TaskSection(answer_format=fmt), runner, seed=0)
    prompt, ids = env.proposer_prompt(tt, random.Random(3))
    assert ids and all(env.buffer.get(i) for i in ids) and "f" in prompt
    if tt == "induction":
        body = "".join(f"```input\n{x}\n```\n" for x in ["[1, 2]", "[5]", "[]", "[3, 3, 4]"])
        body += "```message\nLook at the lists.\n```"
        prog = env.buffer.get(ids[0]).program
    else:
        prog = "def f(s, n):\n    return [c * n for c in s]"
        body = f"```python\n{prog}\n```\n```input\n'ab', 2\n```"
    text = f"<think>ok</think>\n<answer>\n{body}\n</answer>" if fmt == "think_answer" else body
    task = env.parse_proposal(tt, text, ids, "p0")
    if tt == "induction":  # the sampled program may not accept lists; use a known one
        task = task.model_copy(update={"program": "def f(xs):\n    return sum(xs) - len(xs)"})
    [task] = env.validate([task])
    assert task.valid, task.invalid_reason
    sp = env.solver_prompt(task)
    assert ("```" in sp) and (("<answer>" in sp) == (fmt == "think_answer"))
    if tt == "induction":
        assert "[1, 2]" in sp and "[3, 3, 4]" not in sp  # hidden pairs stay hidden
    gold = env.gold_answer_text(task)
    old, new = {"deduction": ("'aa'", "'ab'"), "abduction": ("2", "3"),
                "induction": ("- len", "+ len")}[tt]
    assert old in gold
    wrong = gold.replace(old, new)
    atts = [env.parse_attempt(task, gold, 0), env.parse_attempt(task, wrong, 1),
            env.parse_attempt(task, "no idea", 2)]
    verdicts = env.grade([(task, a) for a in atts])
    assert [v.correct for v in verdicts] == [True, False, False]
    assert [env.solver_reward(a, v) for a, v in zip(atts, verdicts, strict=True)] == [1, 0, 0]


def _task() -> Task:
    return Task(task_id="t", task_type="deduction", program="def f(x):\n    return x",
                inputs=["3"], outputs=["3"], valid=True)


def test_solver_reward_modes(runner):
    task = _task()
    ok = Attempt(task_id="t", index=0, answer="3")
    wrong = Attempt(task_id="t", index=1, answer="4")
    bad = Attempt(task_id="t", index=2, answer="", parse_error="no_output_block")
    for mode, expect in [("binary", [1.0, 0.0, 0.0]), ("azr", [1.0, -0.5, -1.0])]:
        env = CodeEnvironment(TaskSection(solver_reward=mode), runner)
        vs = env.grade([(task, a) for a in (ok, wrong, bad)])
        assert [env.solver_reward(a, v) for a, v in zip((ok, wrong, bad), vs,
                                                         strict=True)] == expect


def test_verified_solution_modes(runner):
    task = _task()
    gen = Generation(prompt_ids=[1], completion_ids=[2], logprobs=[0.0],
                     text="reasoning...\n```output\n3\n```")
    atts = [Attempt(task_id="t", index=0, answer="4"),
            Attempt(task_id="t", index=1, answer="3", generation=gen),
            Attempt(task_id="t", index=2, answer="3")]
    verdicts = [Verdict(task_id="t", index=i, correct=i > 0) for i in range(3)]
    env = CodeEnvironment(TaskSection(verified_solution="attempt"), runner)
    assert env.verified_solution(task, atts, verdicts) == gen.text
    assert env.verified_solution(task, atts[2:], verdicts) == "```output\n3\n```"
    assert env.verified_solution(task, atts[:1], verdicts[:1]) is None
    gold_env = CodeEnvironment(TaskSection(verified_solution="gold",
                                           answer_format="think_answer"), runner)
    sol = gold_env.verified_solution(task, atts[:1], verdicts[:1])
    assert sol == gold_env.gold_answer_text(task)
    assert sol.startswith("<think>") and "<answer>\n```output\n3\n```\n</answer>" in sol
    parsed = gold_env.parse_attempt(task, sol, 0)
    assert parsed.answer == "3"


def test_proposer_prompt_shows_k_references(runner):
    env = CodeEnvironment(TaskSection(), runner, num_references=3)
    prompt, ids = env.proposer_prompt("deduction", random.Random(0))
    assert len(ids) == 3 and prompt.count("Reference ") == 3
    for i in ids:
        assert env.buffer.get(i).program.strip() in prompt
