"""The messages the stages of one step pass each other (each carries its `Timing`).

A stage that runs on several workers at once (validate and grade on every verifier, score on
every scorer shard) returns one part per worker; `Validated.merge` (once a step, in the
collect stage) and `GradeBatch.merge` put
the parts back together in order, and `GradeBatch.merge` computes the solve rates s(x) once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from compassplay.records import Attempt, Candidate, StepStats, Task, Verdict
from compassplay.step.timing import Timing

T = TypeVar("T")


def part_of(items: list[T], part: int, parts: int) -> list[T]:
    """The `part`-th of `parts` contiguous, near-equal slices of `items` (parts may be empty)."""
    n = len(items)
    lo, hi = (n * part) // parts, (n * (part + 1)) // parts
    return items[lo:hi]


@dataclass
class Proposals:
    """The proposer's output: parsed proposed tasks and buffer tasks the solver also attempts."""

    step: int
    tasks: list[Task]
    seed_tasks: list[Task]
    timing: Timing
    # the proposals' hidden states for the learner (`engines.frozen_states`; empty: none)
    states: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class Validated:
    """Proposed tasks after the well-posedness check (one verifier's slice, or all of them)."""

    step: int
    tasks: list[Task]
    seed_tasks: list[Task]
    timing: Timing

    @property
    def solved(self) -> list[Task]:
        """What the solver attempts: the valid proposed tasks, then the buffer tasks."""
        return [t for t in self.tasks if t.valid] + self.seed_tasks

    @staticmethod
    def merge(parts: list[Validated]) -> Validated:
        """The slices of all verifiers, in part order (timing: their span, summed costs)."""
        return Validated(parts[0].step, [t for p in parts for t in p.tasks], parts[0].seed_tasks,
                         Timing.merge([p.timing for p in parts]))


@dataclass
class AttemptBatch:
    """The solver's attempts: n per solved task, in task order then sample order."""

    attempts: list[Attempt]
    timing: Timing
    states: dict[str, torch.Tensor] = field(default_factory=dict)  # as `Proposals.states`


@dataclass
class GradeBatch:
    """Verdicts in attempt order; after `merge`, `rates` holds s(x) per solved task."""

    verdicts: list[Verdict]
    timing: Timing
    rates: dict[str, float] = field(default_factory=dict)

    @staticmethod
    def merge(parts: list[GradeBatch], solved: list[Task]) -> GradeBatch:
        verdicts = [v for p in parts for v in p.verdicts]
        return GradeBatch(verdicts, Timing.merge([p.timing for p in parts]),
                          solve_rates(solved, verdicts))


def solve_rates(tasks: list[Task], verdicts: list[Verdict]) -> dict[str, float]:
    """s(x) = correct / attempts for each task with attempts."""
    total: Counter = Counter()
    good: Counter = Counter()
    for v in verdicts:
        total[v.task_id] += 1
        good[v.task_id] += int(v.correct)
    return {t.task_id: good[t.task_id] / total[t.task_id] for t in tasks if total[t.task_id]}


@dataclass
class Candidates:
    """Eligible proposed tasks (valid, 0 < s < 1, a verified solution) as scorer inputs."""

    cands: list[Candidate]
    timing: Timing


@dataclass
class ScoredShard:
    """Additive alignment partials of one scorer shard (replica: a slice of candidates;
    param shard: all candidates over a slice of parameters)."""

    cands: list[Candidate]
    index: list[int]
    inner: list[float]
    sq: list[float]
    ref_sq: float
    timing: Timing
    proj: list[list[float]] | None = None
    ref_proj: list[float] | None = None
    utility: dict[str, float] = field(default_factory=dict)
    local_ref_sq: list[float] | None = None  # reward.reference=local: |g_ref|^2 per candidate
    soar: dict[str, float] = field(default_factory=dict)  # SOAR's cost (`scoring.merge_soar`)


@dataclass
class StepResult:
    """What the learner returns for a step: its metrics line and what goes to samples.jsonl."""

    stats: StepStats
    weight_version: int
    extra: dict = field(default_factory=dict)
