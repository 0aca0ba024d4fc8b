"""The math-verify side of `math_grading`: `python -m compassplay.eval.math_worker` serves
checks in a worker process, in its main thread, where math-verify's own signal-based timeouts
work. `check` is also importable in-process (main thread, or `timeouts=False`).
"""

from __future__ import annotations

import sys

PARSE_TIMEOUT_S = 3
VERIFY_TIMEOUT_S = 3


def _configs():
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]


def check(prediction: str, golds: list[str], timeouts: bool = True) -> tuple[bool, str]:
    """(whether the answer in `prediction` equals one of `golds`, the extracted answer).

    `timeouts=False` disables math-verify's signal alarms (needed off the main thread); the
    caller must then bound the time itself (the worker process does)."""
    from math_verify import parse, verify

    pt = PARSE_TIMEOUT_S if timeouts else None
    vt = VERIFY_TIMEOUT_S if timeouts else None
    pred = parse(prediction, extraction_config=_configs(), parsing_timeout=pt)
    extracted = str(pred[1]) if len(pred) > 1 else (str(pred[0]) if pred else "")
    if not pred:
        return False, ""
    for gold in golds:
        g = parse(f"${gold}$", extraction_config=_configs(), parsing_timeout=pt)
        if not g:
            g = parse(gold, extraction_config=_configs(), parsing_timeout=pt)
        if g and verify(g, pred, timeout_seconds=vt):
            return True, extracted
    return False, extracted


def serve() -> None:  # pragma: no cover - runs in the worker process
    """Answer `[prediction, golds]` JSON lines on stdin with `[ok, extracted, error]` lines."""
    import json
    import logging

    logging.disable(logging.WARNING)  # math-verify logs every unparsable answer
    out, sys.stdout = sys.stdout, sys.stderr  # only replies go to the real stdout
    for line in sys.stdin:
        try:
            prediction, golds = json.loads(line)
            ok, extracted = check(str(prediction), [str(g) for g in golds])
            reply = [ok, extracted, ""]
        except Exception as exc:  # a grading failure is a wrong answer, not a crash
            reply = [False, "", f"{type(exc).__name__}: {exc}"[:200]]
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":  # pragma: no cover
    serve()
