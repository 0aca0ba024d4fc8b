"""Parsing of proposals and solver answers: fenced blocks, think/answer, malformed text."""

from __future__ import annotations

from compassplay.config import TaskSection
from compassplay.envs.code import CodeEnvironment
from compassplay.envs.code.parsing import answer_section, fenced_blocks, solver_answer
from compassplay.records import Task

PROPOSAL = """Here is my puzzle.
```python
def f(xs, k):
    return [x * k for x in xs]
```
and the input:
```input
[1, 2, 3], 2
```
"""


def test_fenced_blocks_tags_and_unclosed():
    blocks = fenced_blocks("a\n```python\nx = 1\n```\n```input\n3\n```\n```output\n4")
    assert [(b.tag, b.body, b.closed) for b in blocks] == [
        ("python", "x = 1", True), ("input", "3", True), ("output", "4", False)]


def test_answer_section_reasons():
    assert answer_section("<think>hm</think> <answer> 42 </answer>") == ("42", "")
    assert answer_section("no tags") == ("", "no_answer_tag")
    assert answer_section("<answer>42") == ("", "unclosed_answer")
    assert answer_section("<answer>  </answer>") == ("", "empty_answer")


def test_solver_answer_formats():
    assert solver_answer("so\n```output\n[1, 2]\n```", "output", "fenced") == ("[1, 2]", "")
    assert solver_answer("```\n5\n```", "output", "fenced") == ("5", "")
    assert solver_answer("the answer is 5", "output", "fenced") == ("", "no_output_block")
    assert solver_answer("```output\n5", "output", "fenced") == ("", "unclosed_output_block")
    assert solver_answer("<think>f(2)=4</think>\n<answer>4</answer>", "output",
                         "think_answer") == ("4", "")
    text = "<think>x</think><answer>\n```python\ndef f(a):\n    return a\n```\n</answer>"
    assert solver_answer(text, "code", "think_answer") == ("def f(a):\n    return a", "")
    # the last block of the requested kind wins
    assert solver_answer("```input\n1\n```\n```input\n2\n```", "input", "fenced") == ("2", "")


def test_parse_proposal_io(env):
    t = env.parse_proposal("deduction", PROPOSAL, ["a"], "t1")
    assert t.invalid_reason == "" and t.inputs == ["[1, 2, 3], 2"]
    assert t.program.startswith("def f(xs, k):") and t.seed_ids == ["a"]


def test_parse_proposal_failures_counted(env):
    env.pop_counters()
    bad = [
        ("deduction", "just prose"),
        ("abduction", "```python\ndef f(x):\n    return x\n```"),
        ("deduction", "```python\ndef f(x):\n    return x\n```\n```input\n"),
    ]
    reasons = [env.parse_proposal(tt, text, [], f"b{i}").invalid_reason
               for i, (tt, text) in enumerate(bad)]
    assert reasons == ["parse:no_code_block", "parse:no_input_block",
                       "parse:unclosed_input_block"]
    counts = env.pop_counters()
    assert counts == {"parse:no_code_block": 1, "parse:no_input_block": 1,
                      "parse:unclosed_input_block": 1}
    assert env.pop_counters() == {}


def test_parse_proposal_never_raises(env):
    for text in ["", "```", "<answer>", "```python\n```", "\x00" * 10, "```input\n```" * 50]:
        for tt in ("deduction", "abduction", "induction"):
            t = env.parse_proposal(tt, text, [], "x")
            assert not t.valid and t.invalid_reason.startswith("parse:")


def test_parse_induction_proposal(env):
    ref = env.buffer.sample(1, __import__("random").Random(0))[0]
    text = "```input\n1\n```\n```input\n'a'\n```\n```message\nDoubles things.\n```"
    t = env.parse_proposal("induction", text, [ref.task_id], "i1")
    assert t.program == ref.program and t.inputs == ["1", "'a'"]
    assert t.message == "Doubles things."
    no_msg = env.parse_proposal("induction", "```input\n1\n```", [ref.task_id], "i2")
    assert no_msg.invalid_reason == "parse:no_message_block"
    unknown = env.parse_proposal("induction", text, ["nope"], "i3")
    assert unknown.invalid_reason == "parse:unknown_program"


def test_think_answer_proposal(runner):
    env = CodeEnvironment(TaskSection(answer_format="think_answer"), runner)
    t = env.parse_proposal("deduction", f"<think>plan</think>\n<answer>\n{PROPOSAL}</answer>",
                           [], "t")
    assert t.invalid_reason == "" and t.inputs == ["[1, 2, 3], 2"]
    t2 = env.parse_proposal("deduction", PROPOSAL, [], "t2")
    assert t2.invalid_reason == "parse:no_answer_tag"


def test_parse_attempt(env):
    task = Task(task_id="t", task_type="abduction", program="def f(x):\n    return x",
                inputs=["1"], outputs=["1"], valid=True)
    a = env.parse_attempt(task, "```input\n1\n```", 3)
    assert (a.answer, a.parse_error, a.index) == ("1", "", 3)
    env.pop_counters()
    b = env.parse_attempt(task, "I think it is 1", 0)
    assert b.parse_error == "no_input_block" and b.answer == ""
    assert env.pop_counters() == {"attempt:no_input_block": 1}
