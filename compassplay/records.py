"""Typed records that travel between the stages of a self-play step.

Every record is a small pydantic model that serializes to JSON and back losslessly
(`rec.model_dump_json()` / `Cls.model_validate_json(s)`). No dicts of dicts cross
component boundaries: a stage takes records and returns records.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

TaskType = Literal["deduction", "abduction", "induction", "lean_prove"]
Role = Literal["proposer", "solver"]


class Record(BaseModel):
    """Base for all records: strict about unknown fields, immutable-by-convention."""

    model_config = ConfigDict(extra="forbid")


class Generation(Record):
    """One sampled completion: the tokens a policy update needs.

    `logprobs[i]` is the log-probability (nats) of `completion_ids[i]` under the weights of
    `weight_version` at sampling temperature 1 (behaviour policy for the PPO ratio).
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    text: str
    weight_version: int = 0
    # stop/length: a completion; rejected: the engine refused the prompt (over the context
    # length, empty), error: the request failed (vLLM abort/error). Both carry `error` and
    # no tokens worth training on; the stages mark their task invalid.
    finish_reason: Literal["stop", "length", "rejected", "error"] = "stop"
    error: str = ""

    @property
    def failed(self) -> bool:
        """The engine produced no usable completion (see `error`)."""
        return self.finish_reason in ("rejected", "error")


class Task(Record):
    """A verifiable task. Values (inputs/outputs) are Python literals in `repr` form.

    deduction: program + inputs[0] -> outputs[0]; abduction: program + outputs[0] -> an input;
    induction: (inputs, outputs) pairs + message -> a program, checked on hidden pairs;
    lean_prove: `statement` is a Lean 4 theorem statement to prove.
    `seed_program` is the first reference program the proposer was shown; `seed_texts` holds
    the novelty text (`Environment.novelty_text`) of every reference it was shown, filled at
    proposal time (novelty compares with the closest of them);
    `seed_statement`/`seed_solution` are the local reference's source: the Lean seed's
    statement and verified proof; for code, the solver prompt and gold answer of the shown seed
    `reward.local_reference_seed` picks.
    """

    task_id: str
    task_type: TaskType
    program: str = ""
    inputs: list[str] = Field(default_factory=list)
    outputs: list[str] = Field(default_factory=list)
    message: str = ""
    statement: str = ""
    source: Literal["proposed", "seed"] = "proposed"
    seed_ids: list[str] = Field(default_factory=list)
    seed_program: str = ""
    seed_texts: list[str] = Field(default_factory=list)
    seed_statement: str = ""
    seed_solution: str = ""
    proposal: Generation | None = None
    valid: bool = False
    invalid_reason: str = ""


class Attempt(Record):
    """One solver attempt at a task; `answer` is the parsed answer ('' when unparseable)."""

    task_id: str
    index: int
    answer: str
    parse_error: str = ""
    generation: Generation | None = None


class Verdict(Record):
    """The verifier's judgement of one attempt."""

    task_id: str
    index: int
    correct: bool
    status: str = "ok"
    detail: str = ""


class Candidate(Record):
    """An eligible task with its verified solutions, ready for gradient scoring.

    `prompt_ids` is the solver prompt; `target_ids` the tokens of its first verified solution
    and `more_target_ids` those of the others (task.verified_solution=attempts: every further
    correct attempt, in attempt order, repeats kept). The candidate loss is the mean over
    `solutions` of each one's mean token cross-entropy given the prompt, so g(x) is the mean of
    the per-solution gradients. `ref_prompt_ids`/`ref_target_ids`, when set
    (reward.reference=local), are the example whose loss gradient is this candidate's own
    reference: the solver prompt of its seed and the seed's verified solution.
    """

    task_id: str
    task_type: TaskType
    solve_rate: float
    prompt_ids: list[int]
    target_ids: list[int]
    more_target_ids: list[list[int]] = Field(default_factory=list)
    novelty_tokens: list[int] = Field(default_factory=list)
    seed_tokens: list[int] = Field(default_factory=list)
    ref_prompt_ids: list[int] | None = None
    ref_target_ids: list[int] | None = None

    @property
    def solutions(self) -> list[list[int]]:
        """Token ids of every verified solution: `target_ids` first, then `more_target_ids`."""
        return [self.target_ids, *self.more_target_ids]


class Score(Record):
    """The proposer reward of one task and what it was computed from."""

    task_id: str
    reward: float
    kind: str
    eligible: bool
    solve_rate: float
    cosine: float | None = None
    inner: float | None = None
    grad_norm: float | None = None
    novelty: float | None = None
    # the class reward.normalize=gated_rank gates the proposer's advantage by
    # (`rewards.shaping`): unparsed, invalid (parsed, ill-posed), ineligible (valid, outside
    # the band or unscored), copy (eligible, but the novelty factor of kinds novelty and
    # cos_novelty is 0: the zero-reward class), eligible
    gate: Literal["unparsed", "invalid", "ineligible", "copy", "eligible"] = "ineligible"


class StepStats(Record):
    """One line of metrics.jsonl: what a step did, when each stage ran and what it cost.

    Timing and cost (see `step.timing`; `TIMING_FIELDS` differ between equal runs): wall
    seconds, Unix start/end of each stage and of the step, device seconds per role (GPU-seconds
    = wall x GPUs on GPU roles, else CPU-seconds of the worker process; `device_kind` says
    which), their sum for the step, and `cumulative_device_seconds`: training's device seconds
    up to and including this step (evaluation excluded), carried across resume.
    """

    step: int
    weight_version: int
    # the weight version each role's generations of this step used (None: none generated)
    proposer_weight_version: int | None = None
    solver_weight_version: int | None = None
    proposals: int
    valid: int
    eligible: int
    solve_rate_mean: float
    reward_mean: float
    reward_std: float
    reward_distinct: int  # distinct proposer rewards among eligible candidates (no penalties)
    loss: float
    grad_norm: float
    solver_accuracy: float
    # the learner's update (`engines.training.learner.LearnerStats`): the learning rate it used, the
    # fraction of completion tokens whose PPO ratio was clipped, the k3 KL to the reference
    # (0 without one), the policy's mean token entropy (nats) and the mean completion length
    # (tokens) over the step's trajectories
    lr: float = 0.0
    clip_frac: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    response_length_mean: float = 0.0
    solve_rates: list[float] = Field(default_factory=list)
    parse_failures: dict[str, int] = Field(default_factory=dict)
    invalid_reasons: dict[str, int] = Field(default_factory=dict)
    by_task_type: dict[str, dict[str, float]] = Field(default_factory=dict)
    stage_seconds: dict[str, float] = Field(default_factory=dict)
    step_seconds: float = 0.0  # the sum of the stages' own seconds (stage_seconds)
    # seconds from the previous step's result (the first step: the executor's start) to this
    # one's, as the executor saw them: the stages plus taking weights, moving payloads and
    # dispatch (with pipeline.staleness > 0, the period between results)
    wall_seconds: float | None = None
    # Environment metrics (None when the environment has none): Lean's fraction of targets
    # ever proved; in-band (0<s<1) proposals that copy (token Jaccard > 0.8) or rename
    # (alpha-equal) a reference they were shown (Lean and code); distinct reward values among
    # eligible candidates.
    coverage: float | None = None
    targets_proved: int | None = None  # Lean: distinct targets ever proved (coverage x targets)
    targets_attempted: int | None = None  # Lean: unsolved targets the prover attempted
    copy_rate: float | None = None
    rename_rate: float | None = None
    eligible_reward_distinct: int | None = None
    # The share of the proposer's advantage variance that differs between eligible
    # candidates of one group (the part the reward's score decides; the rest contrasts the
    # classes), pooled over the step's (task type) groups: `engines.training.advantages.score_share`.
    # None when the step has no proposer trajectories.
    score_advantage_share: float | None = None
    # Lean runs on the Ray executor with verifiers.lean.backend=fleet (None otherwise):
    # LeanVerifier actors when the step was recorded, and the most alive since the last step.
    lean_actors: int | None = None
    lean_actors_peak: int | None = None
    # cost accounting (Unix seconds; device-seconds: GPU where a role has GPUs, else CPU)
    stage_start: dict[str, float] = Field(default_factory=dict)
    stage_end: dict[str, float] = Field(default_factory=dict)
    step_start: float = 0.0
    step_end: float = 0.0
    device_seconds: dict[str, float] = Field(default_factory=dict)
    device_kind: dict[str, str] = Field(default_factory=dict)
    step_device_seconds: float = 0.0
    cumulative_device_seconds: float = 0.0
    # reward.kind=soar only (None otherwise): what SOAR's trained copies cost this step --
    # seconds inside the scorer (training + held-out evaluation, summed over shards; also part
    # of stage_seconds["score"] and the scorer's device seconds), the tokens of the copies'
    # inner training passes and of their held-out evaluations, and the groups scored.
    soar_seconds: float | None = None
    soar_train_tokens: int | None = None
    soar_eval_tokens: int | None = None
    soar_groups: int | None = None
    # logging.reference_loss only: the solver's mean token cross-entropy (nats) on the
    # reference set after this step's update.
    reference_loss: float | None = None


# StepStats fields that measure time (or, for the Lean fleet's actor counts, how a cluster
# served the step): they differ between otherwise equal runs
TIMING_FIELDS = ("stage_seconds", "step_seconds", "wall_seconds", "stage_start", "stage_end", "step_start",
                 "step_end", "device_seconds", "step_device_seconds",
                 "cumulative_device_seconds", "soar_seconds", "lean_actors",
                 "lean_actors_peak")


class Trajectory(Record):
    """One sampled completion with its scalar reward, as the learner consumes it.

    Advantages are normalized within each (task_type, role) group of a batch (task-relative
    REINFORCE++); `reward` is the raw scalar (proposer reward or solver reward). Members of a
    group that share a non-empty `subgroup` have their deviations from their own mean
    standardized among themselves (`engines.training.advantages`; reward.normalize=eligible labels the
    eligible proposals "eligible"). A trajectory with a fixed `advantage` is a supervised
    example (solver.train_on=selected: SGS's weighted SFT on selected verified proofs, +1 each):
    it keeps that advantage and takes no part in any group's statistics.
    """

    generation: Generation
    reward: float
    role: Role
    task_type: TaskType
    task_id: str = ""
    subgroup: str = ""
    advantage: float | None = None
    # reward.normalize=gated_rank (proposer trajectories): the class level of the gate and
    # the bounded rank term of the reward's score among recent eligible candidates
    # (`rewards.shaping`); the advantage is the gate's z-score in the group plus `direction`
    gate: float | None = None
    direction: float = 0.0
