"""One grading entry point for every benchmark, and grading a predictions file.

`Grader` owns (or borrows) the code runner and the math grader and starts each only when a
benchmark needs it. Predictions files are JSON lines `{"id": ..., "prediction": "..."}` where
`id` is the dataset's own id (CRUXEval "id", MATH500 "unique_id", ...; see `loaders`) or the
0-based item index for data sets without one.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from compassplay.envs.code.runner import CodeRunner
from compassplay.eval.benchmarks import BENCHMARKS, find_data, load_items
from compassplay.eval.code_grading import grade_code
from compassplay.eval.eval_records import EvalItem, EvalResult, Grade, ItemOutcome
from compassplay.eval.math_grading import MathGrader
from compassplay.eval.pass_at_k import binomial_stderr
from compassplay.eval.provenance import file_sha256
from compassplay.verifiers.sandbox.pool import PythonSandbox


class Grader:
    """`grade(benchmark, items, predictions)`; close() stops what it started."""

    def __init__(self, runner: CodeRunner | None = None, math: MathGrader | None = None,
                 workers: int = 2, timeout_s: float = 10.0) -> None:
        self._runner, self._own_runner = runner, runner is None
        self._math, self._own_math = math, math is None
        self.workers = workers
        self.timeout_s = timeout_s

    def runner(self) -> CodeRunner:
        if self._runner is None:
            self._runner = PythonSandbox(workers=self.workers, timeout_s=self.timeout_s,
                                         memory_mb=512).start()
        return self._runner

    def math(self) -> MathGrader:
        if self._math is None:
            self._math = MathGrader(workers=self.workers, timeout_s=self.timeout_s).start()
        return self._math

    def grade(self, benchmark: str, items: list[EvalItem], predictions: list[str]
              ) -> list[Grade]:
        kind = BENCHMARKS[benchmark].kind
        if kind == "math":
            return self.math().grade(items, predictions)
        return grade_code(kind, items, predictions, self.runner())

    def close(self) -> None:
        if self._own_runner and self._runner is not None:
            self._runner.close()  # type: ignore[attr-defined]
            self._runner = None
        if self._own_math and self._math is not None:
            self._math.close()
            self._math = None

    def __enter__(self) -> Grader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def outcomes(items: list[EvalItem], predictions: list[str], grades: list[Grade],
             finish: list[str] | None = None) -> list[ItemOutcome]:
    finish = finish or [""] * len(items)
    return [ItemOutcome(benchmark=it.benchmark, id=it.id, prediction=p, extracted=g.extracted,
                        correct=g.correct, error=g.error, finish_reason=f)
            for it, p, g, f in zip(items, predictions, grades, finish, strict=True)]


def read_predictions(path: str | Path) -> dict[str, str]:
    """id -> prediction of a predictions jsonl (ids compared as strings)."""
    preds: dict[str, str] = {}
    for lineno, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        obj = json.loads(line)
        if not isinstance(obj, dict) or "id" not in obj or \
                not isinstance(obj.get("prediction"), str):
            raise ValueError(f"{path}:{lineno}: expected {{\"id\": ..., \"prediction\": str}}")
        preds[str(obj["id"])] = obj["prediction"]
    return preds


def grade_file(path: str | Path, benchmark: str, data_dir: str | Path | None, grader: Grader,
               data_files: dict[str, str] | None = None) -> EvalResult:
    """Grade a predictions file against the benchmark's items that it has predictions for.
    An id the data set does not have is an error; items without a prediction are not counted."""
    data, looked = find_data(benchmark, data_dir, data_files)
    if data is None:
        return EvalResult(benchmark=benchmark, skipped=f"no data; looked for {', '.join(looked)}")
    preds = read_predictions(path)
    items = load_items(benchmark, data)
    known = {it.id for it in items}
    unknown = [i for i in preds if i not in known]
    if unknown:
        raise ValueError(f"{path}: ids not in {data}: {unknown[:5]}")
    chosen = [it for it in items if it.id in preds]
    t0 = time.perf_counter()
    texts = [preds[it.id] for it in chosen]
    grades = grader.grade(benchmark, chosen, texts)
    secs = time.perf_counter() - t0
    correct = sum(g.correct for g in grades)
    acc = correct / len(chosen) if chosen else 0.0
    return EvalResult(benchmark=benchmark, accuracy=acc,
                      accuracy_stderr=binomial_stderr(acc, len(chosen)), n=len(chosen),
                      correct=correct, data_path=str(data), data_sha256=file_sha256(data),
                      seconds=secs,
                      grade_seconds=secs, items_per_s=len(chosen) / secs if secs else 0.0,
                      items=outcomes(chosen, texts, grades))
