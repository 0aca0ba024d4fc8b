"""Typed eval records, and the metrics.jsonl schema for eval results and compute cost.

metrics.jsonl (one JSON object per line, see `compassplay.rundir.runlog`) holds three kinds of line:

* step lines: `StepStats` (no "kind" key, or "kind": "step"). A step line carries the cost
  field `cumulative_device_seconds` (device seconds spent by training up to and including the
  step, all devices summed, evaluation excluded; GPU-seconds on GPU roles, CPU-seconds
  otherwise), the per-step timing/cost fields of `compassplay.records.StepStats`, and, for
  Lean runs, `coverage` (cumulative fraction of targets solved) and `copy_rate` (fraction of
  in-band conjectures whose token-Jaccard to their seed exceeds 0.8).
* eval lines: `EvalMetric`, {"kind": "eval", "step", "version", "benchmark", "accuracy", "n",
  "seconds"}: the weights after `step` (weight version `version`) evaluated during training
  (`compassplay.workers.eval_worker`); `seconds`: wall seconds of that benchmark's evaluation.
* cost lines: `CostMetric`, {"kind": "cost", "step", "cumulative_device_seconds"}, for writers
  that account cost apart from the step line.

Every field past "kind"/"step" may be missing in old runs; readers skip what is not there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

EVAL_KIND = "eval"
COST_KIND = "cost"
STEP_KIND = "step"
COST_FIELD = "cumulative_device_seconds"
# Step-line curves of `compassplay report` (present when the run logged them): the reference
# loss (logging.reference_loss), Lean's coverage, copy and rename rates (Lean and code).
CURVE_FIELDS = ("reference_loss", "coverage", "copy_rate", "rename_rate")


@dataclass(frozen=True)
class EvalItem:
    """One benchmark item. Code items use code/input/output/entry_point (CRUXEval,
    LiveCodeBench) or problem/test/entry_point (HumanEval, `answer` = canonical solution);
    math items use problem/answer, and `alt_answers` are further accepted answers (Minerva)."""

    def golds(self) -> tuple[str, ...]:
        return (self.answer, *self.alt_answers)

    benchmark: str
    id: str
    problem: str = ""
    answer: str = ""
    alt_answers: tuple[str, ...] = ()
    code: str = ""
    input: str = ""
    output: str = ""
    entry_point: str = "f"
    test: str = ""


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Grade(_Record):
    """The verdict on one prediction: `extracted` is the answer the grader read out of it."""

    correct: bool
    extracted: str = ""
    error: str = ""


class ItemOutcome(_Record):
    """One line of the predictions jsonl."""

    benchmark: str
    id: str
    prediction: str
    extracted: str = ""
    correct: bool
    error: str = ""
    finish_reason: str = ""
    sample: int | None = None  # None: the greedy completion; j: the j-th sampled one


class EvalResult(_Record):
    """One benchmark's result. `skipped` is the reason when it did not run (data missing).

    accuracy: greedy accuracy over n items, `accuracy_stderr` its binomial standard error
    sqrt(p (1 - p) / n); with samples > 0 (at `temperature`), `pass_at_k` maps k (as text) to
    the unbiased pass@k over `samples` completions per item; `data_sha256`: of the data file."""

    benchmark: str
    accuracy: float | None = None
    accuracy_stderr: float | None = None
    n: int = 0
    correct: int = 0
    samples: int = 0
    temperature: float | None = None
    pass_at_k: dict[str, float] = Field(default_factory=dict)
    skipped: str = ""
    data_path: str = ""
    data_sha256: str = ""
    seconds: float = 0.0
    generate_seconds: float = 0.0
    grade_seconds: float = 0.0
    items_per_s: float = 0.0
    items: list[ItemOutcome] = Field(default_factory=list)

    def summary(self) -> dict:
        """The result without its per-item outcomes (for the output JSON)."""
        return self.model_dump(exclude={"items"})


class EvalMetric(_Record):
    """An eval line of metrics.jsonl."""

    kind: Literal["eval"] = EVAL_KIND
    step: int
    version: int = 0
    benchmark: str
    accuracy: float
    n: int = 0
    seconds: float = 0.0

    @classmethod
    def from_result(cls, r: EvalResult, step: int, version: int = 0) -> EvalMetric:
        if r.accuracy is None:
            raise ValueError(f"{r.benchmark} was skipped ({r.skipped}); nothing to record")
        return cls(step=step, version=version, benchmark=r.benchmark, accuracy=r.accuracy, n=r.n,
                   seconds=r.seconds)


class CostMetric(_Record):
    """A cost line of metrics.jsonl (or put COST_FIELD on the step line instead)."""

    kind: Literal["cost"] = COST_KIND
    step: int
    cumulative_device_seconds: float = Field(ge=0.0)


def line_kind(row: dict) -> str:
    """'step', 'eval', 'cost' (or whatever a newer writer put in "kind")."""
    return str(row.get("kind", STEP_KIND))
