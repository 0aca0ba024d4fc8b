"""`Environment`: what the step's stages need from a task domain (coding, Lean).

The stages (`compassplay.step.stages`) call only these methods, so a second domain plugs in by
implementing them. Text in, records out; nothing here raises on model output (an unparseable
proposal or attempt becomes a record with its reason). The task buffer lives in the
environment of the proposer's worker, which owns it: `add_to_buffer` is its explicit update
stage and `state_dict`/`load_state_dict` its checkpoint state.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import Any

from compassplay.engines.generation.base import Segment
from compassplay.records import Attempt, Score, Task, Verdict
from compassplay.rewards.functions import Tokenize, regex_tokenize


class Environment(ABC):
    """Prompts, parsing, validation, grading, verified solutions, rewards and the buffer."""

    # ------------------------------------------------------------ proposer side
    @abstractmethod
    def proposer_prompt(self, task_type: str, rng: random.Random) -> tuple[str, list[str]]:
        """(user message, ids of the buffer tasks it shows: the seeds of the proposal)."""

    def can_propose(self, task_type: str) -> bool:
        """Whether `proposer_prompt` has a seed to show for `task_type` now (Lean: a proved
        target); a step proposes nothing of a type that has none. Default True."""
        return True

    @abstractmethod
    def response_prefix(self, role: str, task_type: str) -> str:
        """The opening of a well-formed reply of `role` ('proposer'/'solver'), to prefill."""

    def response_template(self, role: str, task_type: str, max_tokens: int) -> tuple[Segment, ...]:
        """Constrained decoding after the prefilled opening (`SamplingParams.template`): the
        free blocks of a well-formed reply, each capped at `max_tokens`. () = free sampling."""
        return ()

    @abstractmethod
    def parse_proposal(self, task_type: str, text: str, seed_ids: list[str],
                       task_id: str) -> Task:
        """The proposed task; unparseable -> valid=False, invalid_reason 'parse:<why>'."""

    @abstractmethod
    def validate(self, tasks: list[Task]) -> list[Task]:
        """Well-posedness check (with the verifier): copies with valid/invalid_reason/gold."""

    # -------------------------------------------------------------- solver side
    @abstractmethod
    def solver_prompt(self, task: Task) -> str:
        """The solver's user message for a valid task."""

    @abstractmethod
    def parse_attempt(self, task: Task, text: str, index: int) -> Attempt:
        """The solver's answer; parse_error holds the reason when there is none."""

    @abstractmethod
    def grade(self, pairs: list[tuple[Task, Attempt]]) -> list[Verdict]:
        """One verdict per (task, attempt) pair, in order (batched on the verifier)."""

    @abstractmethod
    def solver_reward(self, attempt: Attempt, verdict: Verdict) -> float:
        """The solver's RL reward for one graded attempt."""

    @abstractmethod
    def verified_solution(self, task: Task, attempts: list[Attempt],
                          verdicts: list[Verdict]) -> str | None:
        """The first solution text whose loss gradient scores the task (None: no verified one)."""

    def verified_solutions(self, task: Task, attempts: list[Attempt],
                           verdicts: list[Verdict]) -> list[str]:
        """Every solution text whose loss scores the task (task.verified_solution): g(x) is
        the gradient of their mean loss ([]: not scored). Default: `verified_solution`'s."""
        one = self.verified_solution(task, attempts, verdicts)
        return [] if one is None else [one]

    # ------------------------------------------------------------------ novelty
    @abstractmethod
    def novelty_pair(self, task: Task) -> tuple[str, str]:
        """(the task's text, the text of the seed it was written from) for token Jaccard."""

    def novelty_text(self, task: Task) -> str:
        """What the proposer wrote, as compared by novelty (default: `novelty_pair`'s first)."""
        return self.novelty_pair(task)[0]

    def reference_texts(self, task_type: str, seed_ids: list[str]) -> list[str]:
        """The novelty texts of the buffer tasks a `task_type` proposal was shown (`seed_ids`),
        in the form `novelty_text` gives a proposal of that type; [] = use `novelty_pair`."""
        return []

    def seed_reference(self, task_type: str, seed_id: str) -> dict[str, str]:
        """The local-reference fields (`seed_statement`, `seed_solution`) a `task_type`
        proposal gets from shown seed `seed_id`; {} when there is none (the default: the
        environment sets them when it parses the proposal)."""
        return {}

    def local_reference(self, task: Task) -> tuple[str, str] | None:
        """(solver prompt text, verified solution text) of the seed `task` was written from,
        whose loss gradient is the task's local reference (reward.reference=local); None when
        the environment has none for it (the default)."""
        return None

    # ------------------------------------------------------------------- buffer
    @abstractmethod
    def seed_of(self, task_id: str) -> Task | None:
        """A buffer task by id (the seeds a proposal was conditioned on)."""

    @abstractmethod
    def sample_buffer(self, k: int, rng: random.Random) -> list[Task]:
        """k buffer tasks the solver also attempts this step (keeps it busy early on)."""

    @abstractmethod
    def add_to_buffer(self, tasks: list[Task]) -> int:
        """Add this step's valid proposed tasks; returns how many were new."""

    def record_results(self, tasks: list[Task], attempts: list[Attempt],
                       verdicts: list[Verdict]) -> dict[str, float]:
        """After grading (on the buffer's owner): learn from the step's verdicts (Lean: proved
        targets become seeds). Returns step metrics such as {'coverage': ...}; default {}."""
        return {}

    def step_metrics(self, tasks: list[Task], rates: dict[str, float], scores: list[Score],
                     tokenize: Tokenize = regex_tokenize) -> dict[str, float]:
        """Domain metrics of one step for `StepStats` (copy_rate, rename_rate; copies on the
        tokens `tokenize` gives, the run's novelty tokens); default {}."""
        return {}

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The buffer (and any other state that must survive a restart), JSON-serializable."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
