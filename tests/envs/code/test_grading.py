"""Grading: gold answers are correct and perturbed answers incorrect, for all task types."""

from __future__ import annotations

from compassplay.config import TaskSection
from compassplay.envs.code import CodeEnvironment
from compassplay.envs.code.pairs import hidden_pairs, visible_count, visible_pairs
from compassplay.envs.code.programs import values_equal
from compassplay.records import Attempt, Task

PROG = "def f(xs, k):\n    return [x for x in xs if x % k == 0]"


def att(task: Task, answer: str, i: int = 0, err: str = "") -> Attempt:
    return Attempt(task_id=task.task_id, index=i, answer=answer, parse_error=err)


def test_values_equal():
    assert values_equal("[1, 2]", "[1,2]") and values_equal("{'a': 1}", "{ 'a' :1 }")
    assert values_equal("(1,)", "(1, )") and values_equal("{2, 1}", "{1, 2}")
    assert not values_equal("[1, 2]", "[2, 1]") and not values_equal("'1'", "1")
    assert values_equal("not a literal", "not  a literal")


def test_all_types_gold_correct_perturbed_incorrect(env):
    [ded] = env.validate([Task(task_id="d", task_type="deduction", program=PROG,
                               inputs=["[3, 4, 6, 9, 10], 3"])])
    abd = ded.model_copy(update={"task_id": "a", "task_type": "abduction"})
    ind_prog = "def f(s):\n    return s.upper()[::-1]"
    [ind] = env.validate([Task(task_id="i", task_type="induction", program=ind_prog,
                               inputs=["'ab'", "'xyz'", "''", "'Hi'", "'q1'"], message="m")])
    assert ded.valid and ded.outputs == ["[3, 6, 9]"] and ind.valid
    pairs = [
        (ded, att(ded, "[3, 6, 9]")), (ded, att(ded, "[3,6,9]", 1)),  # gold, reformatted
        (ded, att(ded, "[3, 6, 10]", 2)), (ded, att(ded, "", 3, "no_output_block")),
        (abd, att(abd, "[3, 4, 6, 9, 10], 3")),           # gold input
        (abd, att(abd, "[3, 1, 6, 9], 3", 1)),            # different input, same output -> ok
        (abd, att(abd, "[9, 3, 6], 3", 2)),               # order differs -> wrong
        (abd, att(abd, "[1, 2], 0", 3)),                  # raises
        (abd, att(abd, "xs=[1]", 4)),                     # not a literal
        (ind, att(ind, ind_prog)),                        # gold program
        (ind, att(ind, "def f(s):\n    return ''.join(reversed(s.upper()))", 1)),
        (ind, att(ind, "def f(s):\n    return s.upper()", 2)),           # perturbed
        (ind, att(ind, "import os\ndef f(s):\n    return s", 3)),        # banned
    ]
    verdicts = env.grade(pairs)
    got = [(v.task_id, v.index, v.correct, v.status) for v in verdicts]
    assert got == [
        ("d", 0, True, "ok"), ("d", 1, True, "ok"), ("d", 2, False, "ok"),
        ("d", 3, False, "parse_error"),
        ("a", 0, True, "ok"), ("a", 1, True, "ok"), ("a", 2, False, "ok"),
        ("a", 3, False, "runtime_error"), ("a", 4, False, "input_not_literal"),
        ("i", 0, True, "ok"), ("i", 1, True, "ok"), ("i", 2, False, "ok"),
        ("i", 3, False, "invalid_program"),
    ]


def test_grading_timeout(quick_runner):
    env = CodeEnvironment(TaskSection(), quick_runner)
    [t] = env.validate([Task(task_id="a", task_type="abduction",
                             program="def f(n):\n    while n:\n        pass\n    return n",
                             inputs=["0"])])
    [v] = env.grade([(t, att(t, "1"))])
    assert t.valid and not v.correct and v.status == "timeout"


def test_induction_checks_hidden_pairs_only(env):
    prog = "def f(x):\n    return x * 2"
    [t] = env.validate([Task(task_id="i", task_type="induction", program=prog,
                             inputs=["1", "2", "3", "4", "5"], message="m")])
    assert visible_count(5) == 3 and len(visible_pairs(t)) == 3
    assert hidden_pairs(t) == [("4", "8"), ("5", "10")]
    # memorizes the visible pairs only -> wrong on the hidden ones
    lookup = "def f(x):\n    return {1: 2, 2: 4, 3: 6}.get(x, 0)"
    [v] = env.grade([(t, att(t, lookup))])
    assert not v.correct and v.detail == "2/2 outputs differ"


def test_grading_invalid_task(env):
    t = Task(task_id="x", task_type="deduction", program="def f(): pass",
             invalid_reason="syntax_error")
    [v] = env.grade([(t, att(t, "1"))])
    assert not v.correct and v.status == "invalid_task"
