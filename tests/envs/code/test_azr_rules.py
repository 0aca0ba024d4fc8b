"""AZR's validity rules (the defaults): prints and comments stripped, not rejected; an induction
task with any failing input rejected; buffer tasks posed as any configured type; the two
determinism runs under two string-hash seeds."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter

from compassplay.config import TaskSection
from compassplay.envs.code import CodeEnvironment
from compassplay.envs.code.programs import strip_prints
from compassplay.envs.code.validity import HASH_SEEDS, validate_tasks
from compassplay.records import Task

BANNED = TaskSection().banned_modules
PRINTS = ("def f(x):\n    # double it\n    print('x is', x)\n    if x > 0:\n"
          "        print(x)\n    return x * 2  # done\n")


def test_strip_prints_removes_print_statements_and_comments():
    out = strip_prints(PRINTS)
    assert "print" not in out and "#" not in out
    assert out == "def f(x):\n    if x > 0:\n        pass\n    return x * 2"
    assert strip_prints("def f(x):\n    return x") == "def f(x):\n    return x"
    assert strip_prints("def f(x) print(x)") == "def f(x) print(x)"  # unparsable: unchanged


def test_programs_that_print_are_stripped_then_validated(runner):
    task = Task(task_id="p", task_type="deduction", program=PRINTS, inputs=["3"])
    [v] = CodeEnvironment(TaskSection(), runner).validate([task])
    assert v.valid and v.outputs == ["6"] and "print" not in v.program
    [old] = CodeEnvironment(TaskSection(strip_prints=False), runner).validate([task])
    assert not old.valid and old.invalid_reason == "prints"


def test_induction_task_with_a_failing_input_is_invalid(runner):
    env = CodeEnvironment(TaskSection(types=["induction"]), runner)
    base = Task(task_id="i", task_type="induction", program="def f(x):\n    return 10 // x",
                message="m", inputs=["1", "2", "5", "2"])
    fail = base.model_copy(update={"inputs": ["1", "2", "0", "5"]})
    nonlit = base.model_copy(update={"task_id": "j", "inputs": ["1", "2", "dict()", "5"]})
    ok, bad, bad2 = env.validate([base, fail, nonlit])
    assert ok.valid and ok.inputs == ["1", "2", "5"]  # a duplicate input is only dropped
    assert (bad.valid, bad.invalid_reason) == (False, "runtime_error")
    assert (bad2.valid, bad2.invalid_reason) == (False, "input_not_literal")


def test_buffer_tasks_are_posed_as_every_configured_type():
    env = CodeEnvironment(TaskSection(types=["deduction", "abduction", "induction"]), None)
    picked = env.sample_buffer(12, random.Random(0))
    types = Counter(t.task_type for t in picked)
    assert set(types) == {"deduction", "abduction", "induction"} and sum(types.values()) == 12
    assert len({t.task_id for t in picked}) == 12
    io_ids = {t.task_id for t in env.buffer.pool("deduction")}
    assert all(t.task_id in io_ids for t in picked if t.task_type == "abduction")
    assert all(t.outputs for t in picked)
    only = CodeEnvironment(TaskSection(types=["abduction"]), None)
    assert {t.task_type for t in only.sample_buffer(6, random.Random(1))} == {"abduction"}
    stored = CodeEnvironment(TaskSection(types=["abduction"], typed_seed_tasks=False), None)
    assert "abduction" not in {t.task_type for t in stored.sample_buffer(6, random.Random(1))}


class SeededRunner:
    """Runs each program in a fresh interpreter under the PYTHONHASHSEED it is given."""

    def __init__(self) -> None:
        self.seeds: list[int] = []

    def run_many(self, codes: list[str], hash_seeds: list[int] | None = None):
        from tests.envs.code.conftest import SubprocessResult

        self.seeds += list(hash_seeds or [])
        out = []
        for code, seed in zip(codes, hash_seeds or [0] * len(codes), strict=True):
            env = {"PATH": os.environ.get("PATH", ""), "PYTHONHASHSEED": str(seed)}
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=30, env=env)
            out.append(SubprocessResult("ok" if p.returncode == 0 else "error", p.stdout,
                                        p.stderr, p.returncode, 0.0))
        return out


def test_determinism_runs_use_two_string_hash_seeds():
    words = repr(["apple", "banana", "cherry", "date", "elder", "fig", "grape", "kiwi"])
    runner = SeededRunner()
    tasks = [Task(task_id="set", task_type="deduction",
                  program="def f(xs):\n    return list(set(xs))", inputs=[words]),
             Task(task_id="ok", task_type="deduction",
                  program="def f(xs):\n    return sorted(set(xs))", inputs=[words])]
    out = validate_tasks(tasks, runner, BANNED)
    assert runner.seeds == [HASH_SEEDS[0]] * 2 + [HASH_SEEDS[1]] * 2
    assert HASH_SEEDS[0] != HASH_SEEDS[1]
    assert [(t.valid, t.invalid_reason) for t in out] == [(False, "nondeterministic"),
                                                           (True, "")]
