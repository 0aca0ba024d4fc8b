"""Determinism checks see set-order dependence: two runs under two string-hash seeds."""

from __future__ import annotations

import pytest

from compassplay.config import TaskSection
from compassplay.envs.code.validity import validate_tasks
from compassplay.records import Task
from compassplay.verifiers.sandbox.pool import PythonSandbox

WORDS = ["apple", "banana", "cherry", "date", "elder", "fig", "grape", "kiwi"]
SET_ORDER = f"print(list(set({WORDS!r})))"


def test_hash_seeds_change_set_order(sandbox: PythonSandbox) -> None:
    a0, b0, a1, b1 = sandbox.run_many([SET_ORDER] * 4, hash_seeds=[0, 0, 1, 1])
    assert {r.status for r in (a0, b0, a1, b1)} == {"ok"}
    assert a0.stdout == b0.stdout and a1.stdout == b1.stdout  # one seed: reproducible
    assert a0.stdout != a1.stdout                             # two seeds: different order
    env = sandbox.run("import os\nprint(os.environ['PYTHONHASHSEED'])", hash_seed=1)
    assert env.stdout == "1\n"
    assert sandbox.run(SET_ORDER).stdout == a0.stdout  # the pool's default seed is 0
    with pytest.raises(ValueError, match="PYTHONHASHSEED"):
        sandbox.run("print(1)", hash_seed=-1)


def test_validity_flags_set_order_dependent_tasks(sandbox: PythonSandbox) -> None:
    banned = TaskSection().banned_modules
    inp = repr(WORDS)
    tasks = [
        Task(task_id="set", task_type="deduction",
             program="def f(xs):\n    return list(set(xs))", inputs=[inp]),
        Task(task_id="sorted", task_type="deduction",
             program="def f(xs):\n    return sorted(set(xs))", inputs=[inp]),
        Task(task_id="ind", task_type="induction", message="m",
             program="def f(s):\n    return ''.join(set(s))",
             inputs=["'abcdefgh'", "'hgfedcba'", "'zyxwvuts'", "'qwertyui'", "'asdfghjk'"]),
    ]
    out = validate_tasks(tasks, sandbox, banned)
    assert [(t.valid, t.invalid_reason) for t in out] == [
        (False, "nondeterministic"), (True, ""), (False, "nondeterministic")]
