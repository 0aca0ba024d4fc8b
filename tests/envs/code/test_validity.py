"""Validity of proposed tasks: each rejection reason, and gold outputs of valid tasks."""

from __future__ import annotations

import pytest

from compassplay.config import TaskSection
from compassplay.envs.code import CodeEnvironment
from compassplay.envs.code.programs import (
    check_input,
    check_program,
    harness,
    parse_harness_output,
    values_equal,
)
from compassplay.records import Task

BANNED = TaskSection().banned_modules


def io_task(program: str, inp: str, task_type: str = "deduction", tid: str = "t") -> Task:
    return Task(task_id=tid, task_type=task_type, program=program, inputs=[inp])


@pytest.mark.parametrize("program,reason", [
    ("def f(x) return x", "syntax_error"),
    ("def g(x):\n    return x", "no_entry_function"),
    ("import random\ndef f(x):\n    return random.random()", "banned_import:random"),
    ("from os import path\ndef f(x):\n    return x", "banned_import:os"),
    ("import os.path\ndef f(x):\n    return x", "banned_import:os"),
    ("def f(x):\n    return __import__('time').time()", "banned_call:__import__"),
    ("import importlib\ndef f(x):\n    return x", "banned_import:importlib"),
    ("def f(x):\n    print(x)\n    return x", "prints"),
    ("def f(x):\n    return input()", "reads_input"),
    ("def f(x):\n    return eval(x)", "banned_call:eval"),
    ("def f(x):\n    return ().__class__.__bases__", "banned_attribute:__bases__"),
    ("", "empty_program"),
])
def test_static_program_reasons(program, reason):
    assert check_program(program, BANNED) == reason


def test_static_ok_and_inputs():
    assert check_program("import math\ndef f(x):\n    return math.sqrt(x)", BANNED) == ""
    assert check_input("'hello', 3") == "" and check_input("[1, 2], {'a': (1,)}") == ""
    assert check_input("dict(a=1)") == "input_not_literal"
    assert check_input("  ") == "empty_input"


def test_harness_isolates_program_prints(runner):
    prog = "def f(x):\n    print('__COMPASSPLAY_RESULT__ [1]')\n    return {3, 1, 2}"
    [res] = runner.run_many([harness(prog, ["0", "1"])])
    recs = parse_harness_output(res.stdout, 2)
    assert recs is not None and [r.repr for r in recs] == ["{1, 2, 3}", "{1, 2, 3}"]
    assert all(r.literal for r in recs)


def test_valid_tasks_get_gold_outputs(env):
    tasks = [io_task("def f(a, b):\n    return a * b", "'ab', 3"),
             io_task("def f(xs):\n    return sorted(set(xs))", "[3, 1, 3, 2]", "abduction"),
             io_task("def f(d):\n    return {k: v + 1 for k, v in d.items()}", "{'x': 1}")]
    out = env.validate(tasks)
    assert [t.valid for t in out] == [True, True, True]
    assert [t.outputs for t in out] == [["'ababab'"], ["[1, 2, 3]"], ["{'x': 2}"]]


INVALID = [
    ("def f(x) return x", "1", "syntax_error"),
    ("def g(x):\n    return x", "1", "no_entry_function"),
    ("import random\ndef f(x):\n    return random.random()", "1", "banned_import:random"),
    ("def f(x):\n    return x", "dict(a=1)", "input_not_literal"),
    ("def f(x):\n    return x // 0", "1", "runtime_error"),
    ("def f(x):\n    return lambda: x", "1", "output_not_literal"),
    ("def f(x):\n    return object()", "1", "output_not_literal"),
    ("def f(x):\n    return float('nan')", "1", "output_not_literal"),
    # a whole id: two processes' ids differ by multiples of 16384 (ASLR, measured here), which
    # "% 1000" cancelled about once in 125 runs (16384 k = 0 mod 1000 for k = 125); the
    # prime moduli below keep the difference
    ("def f(x):\n    return x + id(object())", "1", "nondeterministic"),
    ("def f(x):\n    return hash(object()) % 997 + x", "1", "nondeterministic"),
    ("def f(x):\n    return [id([]) % 991, x]", "1", "nondeterministic"),
    ("def f(x):\n    return 'a' * 3000", "1", "output_too_long"),
    ("def f(x):\n    return 'a' * 10 ** 6", "1", "output_limit"),
]


def test_invalid_reasons(env):
    env.pop_counters()
    tasks = [io_task(p, i, tid=f"t{k}") for k, (p, i, _) in enumerate(INVALID)]
    out = env.validate(tasks)
    assert [t.invalid_reason for t in out] == [r for _, _, r in INVALID]
    assert not any(t.valid for t in out)
    counts = env.pop_counters()
    assert counts["invalid:output_not_literal"] == 3 and counts["invalid:nondeterministic"] == 3


def test_parse_failures_pass_through(env):
    t = Task(task_id="p", task_type="deduction", invalid_reason="parse:no_code_block")
    env.pop_counters()
    assert env.validate([t]) == [t]
    assert env.pop_counters() == {}


def test_timeout(quick_runner):
    env = CodeEnvironment(TaskSection(), quick_runner)
    [t] = env.validate([io_task("def f(x):\n    while True:\n        x += 1", "1")])
    assert t.invalid_reason == "timeout"


def test_induction_validation(runner):
    # the pre-AZR rule (task.induction_all_inputs=false): failing inputs are dropped
    env = CodeEnvironment(TaskSection(types=["induction"], induction_all_inputs=False), runner)
    prog = "def f(x):\n    return 10 // x"
    t = Task(task_id="i", task_type="induction", program=prog, message="m",
             inputs=["1", "2", "0", "dict()", "2", "5"])
    [v] = env.validate([t])
    # 0 raises -> dropped; dict() not literal -> dropped; duplicate 2 -> dropped
    assert v.valid and v.inputs == ["1", "2", "5"] and v.outputs == ["10", "5", "2"]
    few = t.model_copy(update={"inputs": ["0", "3"]})
    nondet = t.model_copy(update={"program": "def f(x):\n    return id(object()) + x",
                                  "inputs": ["1", "2", "3"]})
    assert [x.invalid_reason for x in env.validate([few, nondet])] == \
        ["runtime_error", "nondeterministic"]


def test_shipped_seeds_validate(env):
    """Every shipped seed is well-posed and its stored outputs match a sandbox run."""
    seeds = env.buffer.pool()
    assert 24 <= len(seeds) <= 40 and env.seed_skipped == {}
    checked = env.validate([t.model_copy(update={"valid": False, "outputs": []})
                            for t in seeds])
    for s, c in zip(seeds, checked, strict=True):
        assert c.valid, (s.program, c.invalid_reason)
        assert len(c.outputs) == len(s.outputs)
        assert all(values_equal(a, b) for a, b in zip(c.outputs, s.outputs, strict=True))
