"""Solver rewards and the verified solution that the gradient-based proposer reward uses.

Solver reward: `binary` gives 1 for a correct attempt and 0 otherwise; `azr` gives 1 correct,
-0.5 wrong but well-formatted, -1 ill-formatted (the answer could not be parsed).

Verified solutions (text in the solver's answer format): in `attempts` mode the completion
text of every correct attempt, in attempt order (its rendered answer when no generation is
attached; identical texts kept: g(x) is the mean gradient over the solver's verified samples);
in `attempt` mode the first of them only; in `gold` mode the gold answer rendered in the answer
format. No correct attempt (or an invalid task for gold): none.
"""

from __future__ import annotations

from compassplay.records import Attempt, Task, Verdict

ANSWER_KIND = {"deduction": ("output", "output"), "abduction": ("input", "input"),
               "induction": ("code", "python")}


def solver_reward(attempt: Attempt, verdict: Verdict, mode: str = "binary") -> float:
    """Scalar reward of one solver attempt."""
    if verdict.correct:
        return 1.0
    if mode == "azr":
        return -1.0 if attempt.parse_error else -0.5
    return 0.0


def render_answer(task_type: str, answer: str, answer_format: str) -> str:
    """An answer body written the way the solver is asked to write it."""
    _, tag = ANSWER_KIND[task_type]
    fenced = f"```{tag}\n{answer.strip()}\n```"
    if answer_format == "think_answer":
        return f"<think>\n</think>\n<answer>\n{fenced}\n</answer>"
    return fenced


def gold_answer(task: Task) -> str:
    """The gold answer body: the output (deduction), the input (abduction), the program
    (induction)."""
    if task.task_type == "deduction":
        return task.outputs[0] if task.outputs else ""
    if task.task_type == "abduction":
        return task.inputs[0] if task.inputs else ""
    return task.program


def gold_answer_text(task: Task, answer_format: str) -> str:
    """The gold answer rendered in the solver's answer format."""
    return render_answer(task.task_type, gold_answer(task), answer_format)


def verified_solutions(task: Task, attempts: list[Attempt], verdicts: list[Verdict],
                       mode: str, answer_format: str) -> list[str]:
    """The verified solution texts for `task` by `mode` (see module docstring); [] = none."""
    if mode == "gold":
        return [gold_answer_text(task, answer_format)] if task.valid else []
    if mode not in ("attempts", "attempt"):
        raise ValueError(f"unknown verified_solution mode {mode!r}")
    by_index = {v.index: v for v in verdicts if v.task_id == task.task_id}
    out = []
    for att in sorted(attempts, key=lambda a: a.index):
        v = by_index.get(att.index)
        if v is not None and v.correct:
            out.append(att.generation.text if att.generation is not None
                       else render_answer(task.task_type, att.answer, answer_format))
            if mode == "attempt":
                break
    return out


def verified_solution(task: Task, attempts: list[Attempt], verdicts: list[Verdict],
                      mode: str, answer_format: str) -> str | None:
    """The first verified solution text (`verified_solutions`), None when there is none."""
    sols = verified_solutions(task, attempts, verdicts, mode, answer_format)
    return sols[0] if sols else None
