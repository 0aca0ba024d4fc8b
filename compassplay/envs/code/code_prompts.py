"""Proposer and solver prompt text (plain user messages; callers apply the chat template).

Written for this project in the spirit of AZR's prompts: the proposer sees K reference tasks
from the buffer and writes a new program + input (deduction/abduction) or, for induction, a set
of inputs and a message for a given program; the solver sees one task and answers in the
configured format (`fenced` blocks or `<think>...</think> <answer>...</answer>`).
"""

from __future__ import annotations

from compassplay.envs.code.pairs import visible_pairs
from compassplay.records import Task

RULES = """Rules for the program:
- It defines a function named `f`; that call is the whole task.
- It is deterministic and self-contained: no randomness, clocks, files, network, printing or \
reading input, and no imports of {banned}.
- Inputs are the arguments of a call to `f`, written as Python literals (numbers, strings, \
lists, tuples, dicts, sets, booleans, None), e.g. `[3, 1, 2], 'abc'` means `f([3, 1, 2], 'abc')`.
- The return value must be a Python literal too."""

GOALS = {
    "deduction": "Someone will be shown your program and input and must predict the output "
                 "by reasoning alone, so make the computation take a few careful steps.",
    "abduction": "Someone will be shown your program and its output and must find an input "
                 "that produces it, so make the mapping non-trivial to invert.",
}


def _think_note(answer_format: str) -> str:
    if answer_format == "think_answer":
        return ("\nFirst reason inside <think> </think>, then put the blocks inside "
                "<answer> </answer>.")
    return ""


def fence(tag: str, body: str) -> str:
    """A markdown code block tagged `tag` (python, input, output, message)."""
    return f"```{tag}\n{body.strip()}\n```"


def reference_block(i: int, task: Task) -> str:
    """One reference task as shown to the proposer."""
    parts = [f"Reference {i}:", fence("python", task.program)]
    if task.inputs:
        parts.append(fence("input", task.inputs[0]))
    if task.outputs:
        parts.append(fence("output", task.outputs[0]))
    return "\n".join(parts)


def proposer_io_prompt(task_type: str, refs: list[Task], banned: list[str],
                       answer_format: str) -> str:
    """Deduction/abduction proposal: a new program `f` and one input for it."""
    banned_txt = ", ".join(banned[:12]) + (", ..." if len(banned) > 12 else "")
    lines = [f"Design a new Python puzzle for {task_type}. {GOALS[task_type]}", "",
             RULES.format(banned=banned_txt), ""]
    if refs:
        lines += ["Here are existing puzzles. Write something clearly different from them.",
                  ""]
        lines += [reference_block(i + 1, t) + "\n" for i, t in enumerate(refs)]
    lines += ["Reply with exactly two fenced blocks, the program and the input:",
              fence("python", "def f(...):\n    ..."), fence("input", "...")]
    return "\n".join(lines) + _think_note(answer_format)


def proposer_induction_prompt(program: str, n_inputs: int, answer_format: str) -> str:
    """Induction proposal: inputs for a given program plus a message that hints at it."""
    lines = [
        "Here is a Python function `f`:", fence("python", program), "",
        f"Write {n_inputs} different inputs for `f` and a short message. Another person "
        "will see half of the inputs with their outputs plus your message, and must write "
        "the function; the other half checks their answer. Choose inputs that together "
        "pin down what `f` does, and a message that hints at it without giving the code.",
        "Each input is the argument list of one call, as Python literals, e.g. "
        "`[3, 1, 2], 'abc'`.", "",
        f"Reply with {n_inputs} ```input blocks and one ```message block:",
        fence("input", "..."), fence("input", "..."), "...", fence("message", "..."),
    ]
    return "\n".join(lines) + _think_note(answer_format)


def _answer_note(kind: str, answer_format: str) -> str:
    example = {"output": fence("output", "..."), "input": fence("input", "..."),
               "code": fence("python", "def f(...):\n    ...")}[kind]
    if answer_format == "think_answer":
        return ("Reason step by step inside <think> </think>, then give only the answer "
                f"inside <answer> </answer>, e.g. <answer>\n{example}\n</answer>")
    return f"Give your final answer in one fenced block:\n{example}"


def solver_prompt(task: Task, answer_format: str) -> str:
    """The solver's user message for one task."""
    if task.task_type == "deduction":
        return "\n".join([
            "Given this Python function:", fence("python", task.program), "",
            f"What does `f({task.inputs[0].strip()})` return? Write the value as a Python "
            "literal.", _answer_note("output", answer_format)])
    if task.task_type == "abduction":
        return "\n".join([
            "Given this Python function:", fence("python", task.program), "",
            f"Find an input such that `f(<input>)` returns `{task.outputs[0].strip()}`. Write "
            "the arguments of the call as Python literals (e.g. `[1, 2], 'a'`).",
            _answer_note("input", answer_format)])
    if task.task_type == "induction":
        shown = "\n".join(f"f({i.strip()}) == {o.strip()}" for i, o in visible_pairs(task))
        return "\n".join([
            "Write a Python function `f` consistent with these calls:", shown, "",
            f"Hint: {task.message.strip()}" if task.message.strip() else "",
            "Your function will also be checked on other inputs. Use no printing, "
            "randomness or I/O.", _answer_note("code", answer_format)])
    raise ValueError(f"not a coding task type: {task.task_type}")
