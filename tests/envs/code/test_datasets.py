"""Real data (skipped when the shared folder is absent): CRUXEval items and AZR seed files."""

from __future__ import annotations

import json

import pytest

from compassplay.config import TaskSection
from compassplay.envs.code import CodeEnvironment
from compassplay.envs.code.programs import values_equal
from compassplay.envs.code.seeds import load_seed_file
from compassplay.records import Attempt, Task

N_CRUX = 40


def crux_items(shared) -> list[dict]:
    path = shared("cruxeval.jsonl")
    with path.open() as fh:
        return [json.loads(line) for _, line in zip(range(N_CRUX), fh, strict=False)]


def perturb(value: str) -> str:
    return repr((value, "perturbed"))


def test_cruxeval_deduction_and_abduction(env, shared):
    items = crux_items(shared)
    tasks = [Task(task_id=d["id"], task_type="deduction", program=d["code"],
                  inputs=[d["input"]]) for d in items]
    checked = env.validate(tasks)
    valid = [(d, t) for d, t in zip(items, checked, strict=True) if t.valid]
    assert len(valid) >= 0.9 * len(items), [t.invalid_reason for t in checked if not t.valid]
    for d, t in valid:  # gold computed in the sandbox == dataset output
        assert values_equal(t.outputs[0], d["output"]), (d["id"], t.outputs[0], d["output"])
    pairs = []
    for d, t in valid:
        abd = t.model_copy(update={"task_type": "abduction"})
        pairs += [(t, Attempt(task_id=t.task_id, index=0, answer=d["output"])),
                  (t, Attempt(task_id=t.task_id, index=1, answer=perturb(d["output"]))),
                  (abd, Attempt(task_id=t.task_id, index=2, answer=d["input"]))]
    verdicts = env.grade(pairs)
    for (task, a), v in zip(pairs, verdicts, strict=True):
        assert v.correct == (a.index != 1), (task.task_id, a.index, v)


def test_azr_seed_files_load(shared):
    banned = TaskSection().banned_modules
    io_tasks, io_skipped = load_seed_file(shared("azr_7b_coder_seed_io.jsonl"), banned)
    ind_tasks, ind_skipped = load_seed_file(
        shared("azr_7b_coder_code_f_seed_io.jsonl"), banned)
    assert sum(io_skipped.values()) + len(io_tasks) == 256
    assert sum(ind_skipped.values()) + len(ind_tasks) == 256
    assert len(io_tasks) > 150 and len(ind_tasks) > 150
    assert all(t.task_type == "deduction" and t.valid for t in io_tasks)
    assert all(t.task_type == "induction" and len(t.inputs) >= 2 for t in ind_tasks)
    assert "prints" in io_skipped  # AZR's seeds include printing programs; we reject them


def test_azr_seed_file_as_buffer_and_gold_grades(runner, shared):
    path = shared("azr_7b_coder_seed_io.jsonl")
    env = CodeEnvironment(TaskSection(seed_file=str(path)), runner)
    tasks = env.buffer.pool("deduction")[:20]
    pairs = [(t, Attempt(task_id=t.task_id, index=0, answer=t.outputs[0])) for t in tasks]
    pairs += [(t.model_copy(update={"task_type": "abduction"}),
               Attempt(task_id=t.task_id, index=1, answer=t.inputs[0])) for t in tasks]
    verdicts = env.grade(pairs)
    assert sum(v.correct for v in verdicts) >= 0.9 * len(pairs)


def test_seed_file_takes_several_sources_and_names_in_the_data_dir(tmp_path, monkeypatch):
    io = {"snippet": "def f(a):\n    return a + 1", "input": "1", "output": "2", "imports": []}
    ind = {"snippet": "def f(a):\n    return a * 2", "inputs": ["1", "2", "3"],
           "outputs": ["2", "4", "6"], "message": "double it", "imports": []}
    (tmp_path / "io.jsonl").write_text(json.dumps(io) + "\n")
    (tmp_path / "ind.jsonl").write_text(json.dumps(ind) + "\n")
    monkeypatch.setenv("COMPASSPLAY_DATA_DIR", str(tmp_path))
    env = CodeEnvironment(TaskSection(seed_file="io.jsonl, ind.jsonl",
                                      types=["deduction", "induction"]), None)
    assert [t.task_type for t in env.buffer] == ["deduction", "induction"]
    assert len({t.task_id for t in env.buffer}) == 2  # ids carry their file's name
    both = CodeEnvironment(TaskSection(seed_file=f"simple,{tmp_path / 'io.jsonl'}"), None)
    assert len(both.buffer.pool()) == 1 + len(CodeEnvironment(
        TaskSection(seed_file="simple"), None).buffer.pool())
    monkeypatch.delenv("COMPASSPLAY_DATA_DIR")
    with pytest.raises(FileNotFoundError, match="COMPASSPLAY_DATA_DIR"):
        CodeEnvironment(TaskSection(seed_file="io.jsonl"), None)


def test_induction_inputs_come_from_the_config():
    for n in (6, 10):
        env = CodeEnvironment(TaskSection(types=["induction"], induction_inputs=n), None)
        assert env.induction_inputs == n
        segments = env.response_template("proposer", "induction", 40)
        assert len(segments) == n + 1  # n inputs, then the message
    assert TaskSection().induction_inputs == 10  # AZR's code
