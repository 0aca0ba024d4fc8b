"""Which verified solutions the gradient rewards score a task with (task.verified_solution)."""

from __future__ import annotations

from pathlib import Path

import pytest

from compassplay.config import TaskSection, load_config
from compassplay.envs.code import CodeEnvironment
from compassplay.envs.lean import LeanEnvironment
from compassplay.records import Attempt, Generation, Task, Verdict

TARGETS = Path(__file__).parent / "lean" / "targets.jsonl"


def _code_case():
    task = Task(task_id="t", task_type="deduction", program="def f(x):\n    return x",
                inputs=["3"], outputs=["3"], valid=True)
    gen = Generation(prompt_ids=[1], completion_ids=[2], logprobs=[0.0],
                     text="reasoning...\n```output\n3\n```")
    atts = [Attempt(task_id="t", index=0, answer="4"),
            Attempt(task_id="t", index=1, answer="3", generation=gen),
            Attempt(task_id="t", index=2, answer="3"),
            Attempt(task_id="t", index=3, answer="3", generation=gen)]
    verdicts = [Verdict(task_id="t", index=i, correct=i > 0) for i in range(4)]
    return task, atts, verdicts, gen


def test_the_default_is_every_verified_attempt():
    assert TaskSection().verified_solution == "attempts"
    assert load_config(None).task.verified_solution == "attempts"
    assert TaskSection.model_fields["verified_solution"].description.startswith(
        "the solutions")


def test_code_modes():
    task, atts, verdicts, gen = _code_case()
    env = CodeEnvironment(TaskSection(), None)
    # every correct attempt, in attempt order (the rendered answer without a generation);
    # the repeated text is kept (g(x): the mean over the solver's verified samples)
    assert env.verified_solutions(task, atts, verdicts) == [gen.text, "```output\n3\n```",
                                                            gen.text]
    assert env.verified_solutions(task, list(reversed(atts)), verdicts)[0] == gen.text
    assert env.verified_solution(task, atts, verdicts) == gen.text
    assert env.verified_solutions(task, atts[:1], verdicts[:1]) == []
    first = CodeEnvironment(TaskSection(verified_solution="attempt"), None)
    assert first.verified_solutions(task, atts, verdicts) == [gen.text]
    gold = CodeEnvironment(TaskSection(verified_solution="gold"), None)
    assert gold.verified_solutions(task, atts[:1], verdicts[:1]) == [gold.gold_answer_text(task)]
    invalid = task.model_copy(update={"valid": False})
    assert gold.verified_solutions(invalid, atts, verdicts) == []


@pytest.mark.parametrize("mode,want", [("attempts", 2), ("attempt", 1), ("gold", 1)])
def test_lean_scores_every_accepted_proof(mode, want):
    cfg = load_config(None, ["task.domain=lean", f"task.lean.target_file={TARGETS}",
                             f"task.verified_solution={mode}"])
    env = LeanEnvironment(cfg, None)
    task = Task(task_id="c", task_type="lean_prove", statement="theorem c : 1 = 1", valid=True)
    atts = [Attempt(task_id="c", index=i, answer=a)
            for i, a in enumerate(["by rfl", "by simp", "by omega"])]
    verdicts = [Verdict(task_id="c", index=i, correct=i != 1) for i in range(3)]
    sols = env.verified_solutions(task, atts, verdicts)
    assert len(sols) == want and sols[0] == env.verified_solution(task, atts, verdicts)
    assert "rfl" in sols[0] and (want == 1 or "omega" in sols[1])
    assert env.verified_solutions(task, atts[1:2], verdicts[1:2]) == []
