"""Buffer: seeding, dedup by normalized program + input, sampling, state round-trip."""

from __future__ import annotations

import json
import random

from compassplay.config import TaskSection
from compassplay.envs.code import CodeEnvironment, TaskBuffer
from compassplay.envs.code.seeds import load_seed_file, shipped_seed_path
from compassplay.records import Generation, Task


def t(tid: str, program: str, inp: str = "1", tt: str = "deduction", **kw) -> Task:
    return Task(task_id=tid, task_type=tt, program=program, inputs=[inp], outputs=["1"],
                valid=True, **kw)


def test_shipped_seed_set_schema():
    lines = [json.loads(x) for x in shipped_seed_path().read_text().splitlines() if x.strip()]
    assert 24 <= len(lines) <= 40
    assert all({"snippet", "imports"} <= set(d) for d in lines)
    assert sum("inputs" in d for d in lines) >= 3
    assert all(("input" in d and "output" in d) or ("inputs" in d and "message" in d)
               for d in lines)
    tasks, skipped = load_seed_file(shipped_seed_path(), TaskSection().banned_modules)
    assert len(tasks) == len(lines) and not skipped


def test_dedup_normalized():
    buf = TaskBuffer()
    a = t("a", "def f(x):\n    return x + 1")
    same = t("b", "def f(x):  # comment\n\n    return (x + 1)", " 1 ")
    other_input = t("c", "def f(x):\n    return x + 1", "2")
    abd_same = t("d", "def f(x):\n    return x + 1", tt="abduction")
    invalid = t("e", "def f(x):\n    return 7").model_copy(update={"valid": False})
    assert buf.add([a, same, other_input, abd_same, invalid]) == 2
    assert [x.task_id for x in buf] == ["a", "c"]
    assert buf.add([a]) == 0 and len(buf) == 2


def test_sampling_families_and_relabel():
    buf = TaskBuffer()
    buf.add([t(f"d{i}", f"def f(x):\n    return x + {i}") for i in range(5)])
    buf.add([Task(task_id="i0", task_type="induction", program="def f(x):\n    return x",
                  inputs=["1", "2"], outputs=["1", "2"], valid=True)])
    rng = random.Random(0)
    abd = buf.sample(3, rng, "abduction")
    assert len(abd) == 3 and all(x.task_type == "abduction" for x in abd)
    assert len({x.task_id for x in abd}) == 3
    assert [x.task_id for x in buf.sample(5, rng, "induction")] == ["i0"]
    assert len(buf.sample(100, rng)) == 6
    assert buf.sample(2, random.Random(1), "deduction") == \
        buf.sample(2, random.Random(1), "deduction")
    recent = TaskBuffer(strategy="recent", recent_window=2)
    recent.add([t(f"r{i}", f"def f(x):\n    return x * {i}") for i in range(6)])
    assert {x.task_id for x in recent.sample(5, rng, "deduction")} == {"r4", "r5"}


def test_capacity_evicts_oldest_proposed_keeps_seeds():
    buf = TaskBuffer(capacity=3)
    buf.add([t("s", "def f(x):\n    return 0", source="seed")])
    buf.add([t(f"p{i}", f"def f(x):\n    return {i + 1}") for i in range(4)])
    assert [x.task_id for x in buf] == ["s", "p2", "p3"]
    assert buf.add([t("p0again", "def f(x):\n    return 1")]) == 1  # evicted key is free


def test_state_round_trip_drops_generation():
    gen = Generation(prompt_ids=[1], completion_ids=[2], logprobs=[-0.1], text="x")
    buf = TaskBuffer(capacity=10, strategy="recent")
    buf.add([t("a", "def f(x):\n    return x", proposal=gen), t("b", "def f(x):\n    return 2")])
    state = json.loads(json.dumps(buf.state_dict()))
    other = TaskBuffer()
    other.load_state_dict(state)
    assert [x for x in other] == [x for x in buf] and other.strategy == "recent"
    assert all(x.proposal is None for x in other)
    assert other.add([t("c", "def f(x):\n    return x")]) == 0


def test_env_buffer_seeded_and_grows(env, runner):
    n = len(env.buffer)
    assert n >= 24 and all(x.source == "seed" for x in env.buffer)
    text = "```python\ndef f(a):\n    return a[::-1] * 2\n```\n```input\n'abc'\n```"
    task = env.parse_proposal("deduction", text, [], "new")
    [v] = env.validate([task])
    assert env.buffer.add([v]) == 1 and len(env.buffer) == n + 1
    other = CodeEnvironment(TaskSection(), runner, seed=1)
    other.buffer.load_state_dict(env.buffer.state_dict())
    assert len(other.buffer) == n + 1
