"""Grading of solver attempts, batched into a single `runner.run_many` call.

- deduction: the answer and the gold output are compared as evaluated literals
  (`programs.values_equal`); no execution is needed.
- abduction: the candidate input must be a literal argument list; `f(candidate)` is run and its
  result compared with the gold output by value.
- induction: the candidate program must pass the static checks; it is run on the hidden inputs
  (see `pairs`) and must reproduce every hidden output.

`Verdict.status` is `ok` when the check ran (whatever the outcome), else why it could not:
`parse_error`, `invalid_task`, `input_not_literal`, `invalid_program`, `runtime_error`,
`timeout`, `memory`, `output_limit`, `killed`, `no_result`. `detail` says more.
"""

from __future__ import annotations

from compassplay.envs.code.pairs import hidden_pairs
from compassplay.envs.code.programs import (
    check_input,
    check_program,
    harness,
    parse_harness_output,
    values_equal,
)
from compassplay.envs.code.runner import CodeRunner
from compassplay.envs.code.validity import STATUS_REASONS
from compassplay.records import Attempt, Task, Verdict


def _verdict(task: Task, att: Attempt, correct: bool, status: str = "ok",
             detail: str = "") -> Verdict:
    return Verdict(task_id=task.task_id, index=att.index, correct=correct, status=status,
                   detail=detail[:300])


def _plan(task: Task, att: Attempt, banned: list[str]) -> tuple[Verdict | None, str, list]:
    """Either an immediate verdict, or (None, program, [(input, gold), ...]) to run."""
    if att.parse_error:
        return _verdict(task, att, False, "parse_error", att.parse_error), "", []
    if not task.valid or not task.outputs:
        return _verdict(task, att, False, "invalid_task", task.invalid_reason), "", []
    if task.task_type == "deduction":
        ok = values_equal(att.answer, task.outputs[0])
        return _verdict(task, att, ok, detail="" if ok else "output differs"), "", []
    if task.task_type == "abduction":
        reason = check_input(att.answer)
        if reason:
            return _verdict(task, att, False, "input_not_literal", reason), "", []
        return None, task.program, [(att.answer, task.outputs[0])]
    if task.task_type == "induction":
        reason = check_program(att.answer, banned)
        if reason:
            return _verdict(task, att, False, "invalid_program", reason), "", []
        pairs = hidden_pairs(task)
        if not pairs:
            return _verdict(task, att, False, "invalid_task", "no hidden pairs"), "", []
        return None, att.answer, pairs
    return _verdict(task, att, False, "invalid_task", f"type {task.task_type}"), "", []


def grade_attempts(pairs: list[tuple[Task, Attempt]], runner: CodeRunner,
                   banned: list[str]) -> list[Verdict]:
    """One verdict per (task, attempt), in order; all executions in one run_many."""
    verdicts: list[Verdict | None] = [None] * len(pairs)
    jobs: list[tuple[int, list[tuple[str, str]]]] = []
    codes: list[str] = []
    for i, (task, att) in enumerate(pairs):
        v, program, io = _plan(task, att, banned)
        if v is not None:
            verdicts[i] = v
        else:
            jobs.append((i, io))
            codes.append(harness(program, [x for x, _ in io]))
    results = runner.run_many(codes) if codes else []
    for (i, io), res in zip(jobs, results, strict=True):
        task, att = pairs[i]
        recs = parse_harness_output(res.stdout or "", len(io)) if res.status == "ok" else None
        if recs is None:
            status = STATUS_REASONS.get(res.status, res.status) if res.status != "ok" \
                else "no_result"
            verdicts[i] = _verdict(task, att, False, status, (res.stderr or "")[-300:])
            continue
        failed = next((r for r in recs if not r.ok), None)
        if failed is not None:
            verdicts[i] = _verdict(task, att, False, "runtime_error", failed.error)
            continue
        wrong = [k for k, (r, (_, gold)) in enumerate(zip(recs, io, strict=True))
                 if not values_equal(r.repr, gold)]
        detail = f"{len(wrong)}/{len(io)} outputs differ" if wrong else ""
        verdicts[i] = _verdict(task, att, not wrong, "ok", detail)
    return [v for v in verdicts if v is not None]
