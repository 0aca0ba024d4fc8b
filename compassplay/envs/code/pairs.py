"""How induction tasks hold visible and hidden input/output pairs inside one `Task` record.

`task.inputs` / `task.outputs` hold ALL pairs, in proposal order. The first
`visible_count(n) = ceil(n / 2)` pairs are shown to the solver (with `task.message`); the
remaining `n - visible_count(n)` pairs are hidden and decide correctness. A valid induction task
always has at least one visible and one hidden pair (n >= 2).
"""

from __future__ import annotations

from compassplay.records import Task

MIN_PAIRS = 2


def visible_count(n: int) -> int:
    """Pairs shown to the solver out of `n` (the first half, rounded up)."""
    return (n + 1) // 2


def visible_pairs(task: Task) -> list[tuple[str, str]]:
    """The (input, output) pairs the solver sees."""
    k = visible_count(len(task.inputs))
    return list(zip(task.inputs[:k], task.outputs[:k], strict=False))


def hidden_pairs(task: Task) -> list[tuple[str, str]]:
    """The (input, output) pairs a candidate program is checked on."""
    k = visible_count(len(task.inputs))
    return list(zip(task.inputs[k:], task.outputs[k:], strict=False))
