"""Well-posedness of proposed tasks, decided by running them in the sandbox.

A deduction/abduction task is valid when its program passes the static checks
(`programs.check_program`), its input is a literal argument list, `f(input)` runs within the
runner's limits, the result's canonical repr round-trips through `ast.literal_eval`, and two
runs in two separate sandbox executions (fresh processes, under two different string-hash seeds
where the runner supports `hash_seeds`, as `PythonSandbox` does) print the same repr, so a result
that depends on set or dict-of-str iteration order is caught. The gold output `outputs[0]` is
that repr.

Induction tasks (program from the buffer, inputs + message from the proposer) run the program
on every distinct literal input; inputs whose call fails or returns a non-literal are dropped,
any input whose result differs between the two runs makes the task `nondeterministic`, and at
least `pairs.MIN_PAIRS` pairs must remain (see `pairs` for the visible/hidden split).

All tasks of a batch go through one `runner.run_many` call (two harness runs per task).
"""

from __future__ import annotations

import inspect
from collections import Counter

from compassplay.envs.code.pairs import MIN_PAIRS
from compassplay.envs.code.programs import (
    CallResult,
    check_input,
    check_program,
    harness,
    normalize_value,
    parse_harness_output,
    strip_prints,
)
from compassplay.envs.code.runner import CodeRunner, ExecResultLike
from compassplay.records import Task

MAX_OUTPUT_CHARS = 2000
MAX_INDUCTION_INPUTS = 10
HASH_SEEDS = (0, 1)  # PYTHONHASHSEED of the first and the second run of every task
STATUS_REASONS = {"error": "runtime_error", "timeout": "timeout", "memory": "memory",
                  "output_limit": "output_limit", "killed": "killed"}


def static_reason(task: Task, banned: list[str], all_inputs: bool = False
                  ) -> tuple[str, list[str]]:
    """Reason a task fails before execution ('' if none) and the inputs to run.
    `all_inputs` (AZR): an induction input that is not a literal makes the task invalid."""
    reason = check_program(task.program, banned)
    if reason:
        return reason, []
    if task.task_type == "induction":
        seen: set[str] = set()
        inputs = []
        for text in task.inputs:
            key = normalize_value(text)
            bad = check_input(text)
            if bad and all_inputs:
                return bad, []
            if not bad and key not in seen:
                seen.add(key)
                inputs.append(text.strip())
        inputs = inputs[:MAX_INDUCTION_INPUTS]
        return ("too_few_inputs" if len(inputs) < MIN_PAIRS else ""), inputs
    if not task.inputs:
        return "empty_input", []
    reason = check_input(task.inputs[0])
    return reason, [] if reason else [task.inputs[0].strip()]


def _records(res: ExecResultLike, n: int) -> tuple[list[CallResult] | None, str]:
    if res.status != "ok":
        return None, STATUS_REASONS.get(res.status, res.status)
    recs = parse_harness_output(res.stdout or "", n)
    return (recs, "") if recs is not None else (None, "no_result")


def _call_reason(rec: CallResult) -> str:
    if not rec.ok:
        return "runtime_error"
    if not rec.literal:
        return "output_not_literal"
    if len(rec.repr) > MAX_OUTPUT_CHARS:
        return "output_too_long"
    return ""


def _judge(task: Task, inputs: list[str], r1: ExecResultLike,
           r2: ExecResultLike, all_inputs: bool = False) -> Task:
    recs1, reason = _records(r1, len(inputs))
    recs2, reason2 = _records(r2, len(inputs))
    if recs1 is None or recs2 is None:
        return _invalid(task, reason or reason2)
    if task.task_type != "induction":
        reason = _call_reason(recs1[0]) or _call_reason(recs2[0])
        if not reason and recs1[0].repr != recs2[0].repr:
            reason = "nondeterministic"
        if reason:
            return _invalid(task, reason)
        return task.model_copy(update={"inputs": inputs, "outputs": [recs1[0].repr],
                                       "valid": True, "invalid_reason": ""})
    kept_in, kept_out, dropped = [], [], Counter()
    for text, a, b in zip(inputs, recs1, recs2, strict=True):
        reason = _call_reason(a) or _call_reason(b)
        if reason and all_inputs:  # AZR: one failing input makes the task invalid
            return _invalid(task, reason)
        if reason:
            dropped[reason] += 1
        elif a.repr != b.repr:
            return _invalid(task, "nondeterministic")
        else:
            kept_in.append(text)
            kept_out.append(a.repr)
    if len(kept_in) < MIN_PAIRS:
        return _invalid(task, dropped.most_common(1)[0][0] if dropped else "too_few_inputs")
    return task.model_copy(update={"inputs": kept_in, "outputs": kept_out, "valid": True,
                                   "invalid_reason": ""})


def _invalid(task: Task, reason: str) -> Task:
    return task.model_copy(update={"valid": False, "invalid_reason": reason})


def _run_twice(runner: CodeRunner, codes: list[str], n: int) -> list[ExecResultLike]:
    """Run both halves of `codes` in one call, each half under its own string-hash seed when the
    runner accepts `hash_seeds` (other runners: one call, seeds as they come)."""
    try:
        seeded = "hash_seeds" in inspect.signature(runner.run_many).parameters
    except (TypeError, ValueError):
        seeded = False
    if not seeded:
        return runner.run_many(codes)
    seeds = [HASH_SEEDS[0]] * n + [HASH_SEEDS[1]] * (len(codes) - n)
    return runner.run_many(codes, hash_seeds=seeds)  # type: ignore[call-arg]


def validate_tasks(tasks: list[Task], runner: CodeRunner, banned: list[str],
                   counters: Counter | None = None, strip: bool = False,
                   all_inputs: bool = False) -> list[Task]:
    """Validated copies of `tasks` (same order). Tasks that already carry an invalid_reason
    (e.g. parse failures) pass through unchanged. Reasons are counted as `invalid:<reason>`.

    AZR's rules (`TaskSection.strip_prints`, `induction_all_inputs`): `strip` removes print
    statements and comments from deduction/abduction programs first (`strip_prints`; the task
    keeps the stripped program); `all_inputs` rejects an induction task when any input fails."""
    out: list[Task | None] = [None] * len(tasks)
    plans: list[tuple[int, list[str]]] = []
    tasks = list(tasks)
    for i, task in enumerate(tasks):
        if task.invalid_reason:
            out[i] = task
            continue
        if strip and task.task_type != "induction":
            clean = strip_prints(task.program)
            if clean != task.program:
                task = tasks[i] = task.model_copy(update={"program": clean})
        reason, inputs = static_reason(task, banned, all_inputs)
        if reason:
            out[i] = _invalid(task, reason)
        else:
            plans.append((i, inputs))
    codes = [harness(tasks[i].program, inputs, perturb=pad) for pad in (0, 1500)
             for i, inputs in plans]
    n = len(plans)
    results = _run_twice(runner, codes, n) if codes else []
    for j, (i, inputs) in enumerate(plans):
        out[i] = _judge(tasks[i], inputs, results[j], results[n + j], all_inputs)
    final = [t for t in out if t is not None]
    if counters is not None:
        for t, orig in zip(final, tasks, strict=True):
            if not t.valid and t.invalid_reason and not orig.invalid_reason:
                counters[f"invalid:{t.invalid_reason}"] += 1
    return final
