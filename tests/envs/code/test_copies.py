"""The local-reference shortcut in coding: a proposal's local reference is its seed's solver
prompt and gold answer; copies and renames of shown references are measured per step."""

from __future__ import annotations

import random

from compassplay.config import TaskSection
from compassplay.envs.code import CodeEnvironment
from compassplay.envs.code.copies import alpha_normal_program, copy_and_rename_rates, is_rename
from compassplay.records import Task

SEED = "def f(xs, k):\n    total = 0\n    for x in xs:\n        total += x * k\n    return total"


def test_alpha_normal_program_ignores_names_not_structure():
    renamed = SEED.replace("xs", "items").replace("total", "acc").replace("x ", "v ") \
        .replace("x *", "v *")
    assert alpha_normal_program(renamed) == alpha_normal_program(SEED)
    assert alpha_normal_program(SEED.replace("x * k", "x + k")) != alpha_normal_program(SEED)
    # builtins keep their names: len is not a renameable variable
    assert alpha_normal_program("def f(a):\n    return len(a)") != \
        alpha_normal_program("def f(a):\n    return sum(a)")
    assert alpha_normal_program("def f(:") is None


def test_rename_needs_the_same_input_and_a_parsable_text():
    seed_text = f"{SEED}\n[1, 2], 3"
    renamed = seed_text.replace("total", "s")
    assert is_rename(renamed, [seed_text])
    assert not is_rename(renamed.replace("[1, 2], 3", "[1, 2], 4"), [seed_text])
    assert not is_rename("[1, 2]\n[3]\nAdd them up.", ["[1, 2]\n[3]\nAdd them up."])


def test_copy_and_rename_rates_use_the_closest_of_all_shown_references():
    other = "def f(s):\n    return s[::-1]\n'abc'"
    seed_text = f"{SEED}\n[1, 2], 3"
    pairs = [(seed_text.replace("total", "s"), [other, seed_text]),  # copy and rename
             (seed_text.replace("[1, 2], 3", "[1, 2], 4"), [seed_text]),  # copy, other input
             ("def f(n):\n    return n ** 2 - 1\n9", [other, seed_text])]  # neither
    rates = copy_and_rename_rates(pairs)
    assert rates["rename_rate"] == 1 / 3
    assert rates["copy_rate"] == 2 / 3
    assert copy_and_rename_rates([]) == {"copy_rate": 0.0, "rename_rate": 0.0}


def test_a_proposal_carries_its_seeds_solver_prompt_and_gold_answer(runner):
    env = CodeEnvironment(TaskSection(types=["deduction", "abduction"]), runner, seed=0)
    prompt, ids = env.proposer_prompt("abduction", random.Random(1))
    seed = env.buffer.get(ids[0])
    text = "```python\ndef f(a):\n    return a + 1\n```\n```input\n4\n```"
    task = env.parse_proposal("abduction", text, ids, "p0")
    prompt_text, solution = env.local_reference(task)
    posed = seed.model_copy(update={"task_type": "abduction"})
    assert prompt_text == env.solver_prompt(posed) and seed.program in prompt_text
    assert solution == env.gold_answer_text(posed)
    # the seed's gold answer is right: it grades correct on the seed posed that way
    [verdict] = env.grade([(posed, env.parse_attempt(posed, solution, 0))])
    assert verdict.correct
    assert env.local_reference(Task(task_id="x", task_type="deduction")) is None


def test_step_metrics_count_in_band_proposals_only(runner):
    env = CodeEnvironment(TaskSection(), runner, seed=0)
    seed_text = f"{SEED}\n[1, 2], 3"
    def task(i: str, text_program: str, valid: bool = True) -> Task:
        return Task(task_id=i, task_type="deduction", program=text_program, inputs=["[1, 2], 3"],
                    valid=valid, seed_texts=[seed_text])
    tasks = [task("a", SEED.replace("total", "t")), task("b", "def f(a, b):\n    return b"),
             task("c", SEED), task("d", SEED, valid=False)]
    rates = {"a": 0.5, "b": 0.25, "c": 1.0, "d": 0.5}  # c is out of band, d invalid
    assert env.step_metrics(tasks, rates, []) == {"copy_rate": 0.5, "rename_rate": 0.5}
