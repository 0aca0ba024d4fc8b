"""Benchmark prompts: CRUXEval's direct (no chain of thought) input and output prompts, a
boxed-answer math prompt, HumanEval's function completion; and the chat template.

With a chat template (instruct models) the prompt text is the user turn; HumanEval then asks
for the whole function in a code block. Without one (base models) the prompt is used as is and
HumanEval is a plain continuation of the function signature and docstring.
"""

from __future__ import annotations

import hashlib
from typing import Any

from compassplay.eval.eval_records import EvalItem

CRUX_OUTPUT = '''You are given a Python function and an assertion containing an input to the function. Complete the assertion with a literal (no unsimplified expressions, no function calls) containing the output when executing the provided code on the given input, even if the function is incorrect or incomplete. Do NOT output any extra information. Provide the full assertion with the correct output in [ANSWER] and [/ANSWER] tags, following the examples.

[PYTHON]
def f(n):
    return n
assert f(17) == ??
[/PYTHON]
[ANSWER]
assert f(17) == 17
[/ANSWER]

[PYTHON]
def f(s):
    return s + "a"
assert f("x9j") == ??
[/PYTHON]
[ANSWER]
assert f("x9j") == "x9ja"
[/ANSWER]

[PYTHON]
{code}
assert {fn}({input}) == ??
[/PYTHON]
[ANSWER]
'''

CRUX_INPUT = '''You will be given a function f and an output in the form f(??) == output. Find any input such that executing f on the input leads to the given output. There may be multiple answers, but you should only output one. In [ANSWER] and [/ANSWER] tags, complete the assertion with one such input that will produce the output when executing the function.

[PYTHON]
def f(my_list):
    count = 0
    for i in my_list:
        if len(i) % 2 == 0:
            count += 1
    return count
assert f(??) == 3
[/PYTHON]
[ANSWER]
assert f(["mq", "px", "zy"]) == 3
[/ANSWER]

[PYTHON]
def f(s1, s2):
    return s1 + s2
assert f(??) == "banana"
[/PYTHON]
[ANSWER]
assert f("ba", "nana") == "banana"
[/ANSWER]

[PYTHON]
{code}
assert {fn}(??) == {output}
[/PYTHON]
[ANSWER]
'''

MATH = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."

HUMANEVAL_CHAT = ("Complete the following Python function. Reply with the whole function "
                  "(imports included) in one ```python code block.\n\n```python\n{prompt}```")

CRUX_STOP = ["[/ANSWER]"]
HUMANEVAL_BASE_STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#"]

# Bump when a prompt or stop string changes (results record it; tests pin prompt_sha256()).
PROMPT_VERSION = "1"


def prompt_sha256() -> str:
    """Hex sha256 over every prompt template and stop string, in a fixed order."""
    parts = [CRUX_OUTPUT, CRUX_INPUT, MATH, HUMANEVAL_CHAT, *CRUX_STOP, *HUMANEVAL_BASE_STOP]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def prompt_text(kind: str, item: EvalItem, chat: bool) -> str:
    """The prompt of `item` for a grader kind (cruxeval-i, cruxeval-o, livecodebench-exec,
    humaneval, math). LiveCodeBench's execution scenario asks CRUXEval-O's question."""
    if kind in ("cruxeval-o", "livecodebench-exec"):
        return CRUX_OUTPUT.format(code=item.code, fn=item.entry_point, input=item.input)
    if kind == "cruxeval-i":
        return CRUX_INPUT.format(code=item.code, fn=item.entry_point, output=item.output)
    if kind == "humaneval":
        return HUMANEVAL_CHAT.format(prompt=item.problem) if chat else item.problem
    if kind == "math":
        return MATH.format(problem=item.problem)
    raise ValueError(f"unknown grader kind {kind!r}")


def stop_strings(kind: str, chat: bool) -> list[str]:
    if kind.startswith("cruxeval") or kind == "livecodebench-exec":
        return list(CRUX_STOP)
    if kind == "humaneval" and not chat:
        return list(HUMANEVAL_BASE_STOP)
    return []


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def encode(tokenizer: Any, text: str, chat: bool) -> list[int]:
    """Token ids of `text`, as the user turn of the chat template when `chat`."""
    if chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                             tokenize=False, add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    ids = list(tokenizer(text)["input_ids"])
    return ids
