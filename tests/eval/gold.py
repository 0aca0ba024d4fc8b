"""Gold and perturbed (known-wrong) predictions for every benchmark, used by the grader tests
and by `python -m tests.eval.gold DATA_DIR` (prints grader accuracy on the real data)."""

from __future__ import annotations

import re

from compassplay.eval.eval_records import EvalItem


def gold(item: EvalItem, kind: str) -> str:
    if kind in ("cruxeval-o", "livecodebench-exec"):
        return item.output
    if kind == "cruxeval-i":
        return item.input
    if kind == "humaneval":
        return item.answer
    return f"The final answer is $\\boxed{{{item.answer}}}$."


def _bump(answer: str) -> str:
    """A different answer: a number plus one; anything else with a further element."""
    text = answer.replace(",", "").strip()
    if re.fullmatch(r"-?\d+", text):
        return str(int(text) + 1)
    if re.fullmatch(r"-?\d*\.\d+", text):
        return str(float(text) + 1)
    return f"{answer}, 12345"


def perturbed(item: EvalItem, kind: str) -> str:
    if kind in ("cruxeval-o", "livecodebench-exec"):
        return f"({item.output}, 'perturbed')"
    if kind == "cruxeval-i":
        return f"{item.input}, 'perturbed-extra-argument'"
    if kind == "humaneval":
        return "    return None\n"
    return f"The final answer is $\\boxed{{{_bump(item.answer)}}}$."


if __name__ == "__main__":  # pragma: no cover - measurement helper
    import sys
    import time

    from compassplay.eval.benchmarks import BENCHMARKS, find_data, load_items
    from compassplay.eval.grader import Grader

    data_dir = sys.argv[1]
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else list(BENCHMARKS)
    with Grader(workers=2, timeout_s=10.0) as g:
        for name in names:
            path, _ = find_data(name, data_dir)
            if path is None:
                print(f"{name}: no data")
                continue
            items = load_items(name, path)
            kind = BENCHMARKS[name].kind
            for label, fn in (("gold", gold), ("perturbed", perturbed)):
                t0 = time.perf_counter()
                grades = g.grade(name, items, [fn(it, kind) for it in items])
                secs = time.perf_counter() - t0
                acc = sum(x.correct for x in grades) / len(items)
                bad = [(it.id, it.answer or it.output, x.error) for it, x in
                       zip(items, grades, strict=True) if x.correct != (label == "gold")][:4]
                print(f"{name:14s} {label:9s} acc={acc:.4f} n={len(items)} "
                      f"{len(items) / secs:.1f} items/s  e.g. {bad}", flush=True)
