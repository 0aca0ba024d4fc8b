"""Grade code benchmarks by execution; every program runs through the given code runner
(production: `compassplay.verifiers.sandbox.pool.PythonSandbox`, never the host).

- cruxeval-o / livecodebench-exec: `assert <gold output> == <predicted literal>` after the function;
  a prediction that calls the function is rejected (CRUXEval's rule: a literal is asked for).
- cruxeval-i: `assert <gold output> == f(<predicted input>)` after the function.
- humaneval: the completed function, then the dataset's `check(entry_point)` tests.
A program passes when it exits cleanly AND prints a per-call random token as its last act, so
a prediction that exits early (sys.exit(0), os._exit) does not pass.
"""

from __future__ import annotations

import ast
import re
import secrets

from compassplay.envs.code.runner import CodeRunner
from compassplay.eval.eval_records import EvalItem, Grade
from compassplay.eval.extract import code_block, crux_input_call, crux_output


def _calls(expr: str, fn: str) -> bool:
    """Whether the expression calls `fn` (string literals that merely contain `f(` do not)."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return re.search(rf"(?<![\w.]){re.escape(fn)}\s*\(", expr) is not None
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == fn
               for n in ast.walk(tree))


def humaneval_program(item: EvalItem, prediction: str) -> str:
    """Prompt + continuation, or prompt + a whole function (from a code block or bare)."""
    code = code_block(prediction)
    if code is None and re.search(rf"^def {re.escape(item.entry_point)}\s*\(", prediction, re.M):
        code = prediction
    if code is not None:
        return item.problem + "\n\n" + code  # the reply's definition wins
    return item.problem + prediction


def _prepare(kind: str, item: EvalItem, prediction: str) -> tuple[str | None, str, str]:
    """(program or None when rejected, extracted answer, rejection reason)."""
    if kind in ("cruxeval-o", "livecodebench-exec"):
        pred = crux_output(prediction, f"{item.entry_point}({item.input})")
        if not pred:
            return None, pred, "no answer"
        if _calls(pred, item.entry_point):
            return None, pred, "calls the function"
        return f"{item.code}\nassert ({item.output}) == ({pred})\n", pred, ""
    if kind == "cruxeval-i":
        call = crux_input_call(prediction, item.entry_point, item.output)
        if call == f"{item.entry_point}()" and item.input.strip():
            return None, call, "no answer"
        return f"{item.code}\nassert ({item.output}) == {call}\n", call, ""
    if kind == "humaneval":
        prog = humaneval_program(item, prediction)
        return f"{prog}\n\n{item.test}\n\ncheck({item.entry_point})\n", prog, ""
    raise ValueError(f"not a code grader kind: {kind!r}")


def grade_code(kind: str, items: list[EvalItem], predictions: list[str],
               runner: CodeRunner) -> list[Grade]:
    """One Grade per (item, prediction), in order; programs run in parallel on `runner`."""
    if len(items) != len(predictions):
        raise ValueError("items and predictions differ in length")
    token = secrets.token_hex(8)
    prepared = [_prepare(kind, it, p) for it, p in zip(items, predictions, strict=True)]
    to_run = [(i, prog) for i, (prog, _, _) in enumerate(prepared) if prog is not None]
    results = runner.run_many([f"{prog}\nprint({token!r})\n" for _, prog in to_run])
    by_index = dict(zip([i for i, _ in to_run], results, strict=True))
    grades = []
    for i, (prog, extracted, reason) in enumerate(prepared):
        if prog is None:
            grades.append(Grade(correct=False, extracted=extracted, error=reason))
            continue
        r = by_index[i]
        ok = r.status == "ok" and r.stdout.rstrip().endswith(token)
        err = "" if ok else (r.status if r.status != "ok" else "no completion token") + \
            (f": {r.stderr.strip().splitlines()[-1][:200]}" if r.stderr.strip() else "")
        grades.append(Grade(correct=ok, extracted=extracted if kind != "humaneval" else "",
                            error=err))
    return grades
