"""Sections of what is proposed and how it is rewarded: tasks (coding, Lean), the proposer
reward and the reference set."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from compassplay.config.reward_kinds import RewardKind, RewardNeeds, reward_needs
from compassplay.config.section import Section

#: What AZR's released code gives a valid, well-formatted proposal the solver always or never
#: solves: its learnability is 0 there, and a proposal with zero learnability gets -0.5
#: (`reward.outside_reward`'s default under `reward.azr_compat`; see `rewards.functions.difficulty`).
AZR_CODE_OUTSIDE_REWARD = -0.5


class LeanTaskSection(Section):
    """The Lean theorem-proving task (compassplay/envs/lean). The REPL command, the pool size
    (`verifiers.lean.processes`) and its memory limits are in `verifiers.lean`."""

    target_file: str = Field("", description="miniF2F-style jsonl of target statements "
                             "(name, formal_statement, header, split, ...); a path, or a file "
                             "name in $COMPASSPLAY_DATA_DIR; required for lean")
    split: Literal["all", "valid", "test"] = Field("all", description="targets of this split")
    max_targets: int = Field(0, ge=0, description="keep the first N targets (0 = all)")
    header: str = Field("", description="Lean header every check runs after; '' = the "
                        "target file's header (else verifiers.lean.header)")
    targets_per_iteration: int | Literal["all"] = Field(
        "all", description="unsolved targets the prover attempts each iteration (n = "
        "solver.n_samples attempts each): all = every one, as SGS's iteration does; N >= 1 = "
        "a uniform sample of N (cheaper iterations; coverage then grows more slowly per "
        "iteration)")
    check_chunk: int = Field(1024, ge=1, description="Lean checks per verifier-pool call "
                             "(validation, grading): an iteration's checks go in chunks of "
                             "this many, with a progress line after each; a fleet that loses "
                             "an actor resubmits one chunk")
    include_proof: bool = Field(True, description="show the seed's proof in the proposer prompt")
    propose_before_proof: bool = Field(
        False, description="false (paper: g_ref is the solver's verified proof of the seed "
        "the proposer conditions on): the proposer is shown only proved targets, so an "
        "iteration before the first proof has no conjectures (the prover attempts the targets "
        "alone); true: until a target is proved it is shown an unsolved target without a "
        "proof, whose conjectures have no local reference (gradient kinds: ineligible, "
        "reward 0; difficulty and novelty score them as usual)")
    forbid_copies: bool = Field(False, description="the proposer prompt also asks for a "
                                "theorem that is not a copy or a renaming of its seed. Off "
                                "(paper): the copy shortcut a local reference opens is what the "
                                "cos / cos x novelty ablation measures, and the novelty factor, "
                                "not the prompt, is what closes it")
    validate_timeout_s: float = Field(30.0, gt=0.0, le=3600.0,
                                      description="per-check limit (s) for a conjecture with sorry")
    grade_timeout_s: float = Field(60.0, gt=0.0, le=3600.0,
                                   description="per-check limit (s) for a solver's proof")

    @model_validator(mode="after")
    def _targets_positive(self) -> LeanTaskSection:
        if self.targets_per_iteration != "all" and self.targets_per_iteration < 1:
            raise ValueError(f"targets_per_iteration must be 'all' or >= 1, got "
                             f"{self.targets_per_iteration}")
        return self


class TaskSection(Section):
    domain: Literal["code", "lean"] = Field(
        "code", description="code: AZR coding tasks (Python sandbox); lean: theorem proving "
        "on a target set (Lean REPL pool, see task.lean)")
    types: list[Literal["deduction", "abduction", "induction", "lean_prove"]] = Field(
        default_factory=lambda: ["deduction"], description="task types proposed each step "
        "(lean: exactly [lean_prove], the default when task.domain=lean)")
    seed_file: str = Field("", description="AZR-style seed jsonl, or several separated by "
                           "commas, each a path or a file name in $COMPASSPLAY_DATA_DIR; '' = "
                           "the shipped seed set (35 programs), 'simple' = the shipped short "
                           "programs (small models). AZR's 7B runs start from its own 256 io + "
                           "256 induction seeds: azr_7b_coder_seed_io.jsonl,"
                           "azr_7b_coder_code_f_seed_io.jsonl (the 7B configs)")
    induction_inputs: int = Field(10, ge=2, description="inputs an induction proposal writes "
                                  "for its program (half shown, half hidden). AZR's code: 10 "
                                  "(CodeIORewardManager num_inputs); the CPU configs: 6")
    buffer_size: int = Field(4096, ge=1, description="tasks the task buffer holds (seeds and "
                             "valid proposals; the oldest leave first)")
    answer_format: Literal["fenced", "think_answer"] = Field(
        "fenced", description="fenced: replies are markdown code blocks; think_answer: "
        "<think> reasoning </think> then the blocks inside <answer> </answer>")
    banned_modules: list[str] = Field(description="modules a proposed program may not import "
                                      "(nondeterminism, I/O, processes): it is invalid",
                                      default_factory=lambda: [
        "random", "time", "datetime", "os", "sys", "subprocess", "threading",
        "multiprocessing", "logging", "hashlib", "socket", "shutil", "signal", "ctypes",
        "pathlib", "importlib", "asyncio", "secrets", "uuid", "tempfile", "pickle"])
    strip_prints: bool = Field(True, description="AZR: print calls and comments are removed "
                               "from a proposed program before its checks (the solver sees the "
                               "stripped program); false = reject programs that print")
    induction_all_inputs: bool = Field(True, description="AZR: an induction task is invalid "
                                       "when any of its inputs is not a literal, fails to run "
                                       "or returns a non-literal; false = drop such inputs and "
                                       "keep the task while enough pairs remain")
    typed_seed_tasks: bool = Field(True, description="AZR: each buffer task the solver "
                                   "attempts is posed as one of task.types (deduction/abduction "
                                   "seeds as either); false = as stored (io seeds: deduction)")
    verified_solution: Literal["attempts", "attempt", "gold"] = Field(
        "attempts", description="the solutions the gradient rewards score a task with (g(x) = "
        "the gradient of the mean over them of each one's mean token cross-entropy, i.e. the "
        "mean of the per-solution gradients): attempts = every correct attempt of the solver "
        "(Lean: every accepted proof; repeated texts count as often as sampled, merged by the "
        "scorer at no cost); attempt = the first correct attempt only (the earlier behaviour); "
        "none correct: not scored; gold = the task's own answer (Lean: as attempt)")
    solver_reward: Literal["binary", "azr"] = Field(
        "binary", description="binary: 1 correct, 0 otherwise; azr: 1 correct, -0.5 wrong, "
        "-1 ill-formatted")
    lean: LeanTaskSection = Field(default_factory=LeanTaskSection,
                                  description="the Lean theorem-proving task (domain=lean)")

    @model_validator(mode="before")
    @classmethod
    def _lean_types(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("domain") == "lean" and "types" not in data:
            data = {**data, "types": ["lean_prove"]}
        return data

    @model_validator(mode="after")
    def _types_match_domain(self) -> TaskSection:
        lean = ["lean_prove"] if self.domain == "lean" else []
        if (self.domain == "lean") != ("lean_prove" in self.types) or (
                lean and self.types != lean):
            raise ValueError(f"task.types {self.types} do not fit task.domain={self.domain} "
                             "(lean takes exactly [lean_prove], code the coding types)")
        return self


class RewardSection(Section):
    @model_validator(mode="before")
    @classmethod
    def _legacy_azr_compat(cls, data: Any) -> Any:
        """A config written before `ineligible_reward`/`invalid_penalty` (it has `azr_compat`)
        keeps its rewards: ill-posed = format_penalty / 2, outside the band 0 (-0.5 for
        difficulty with azr_compat)."""
        if not isinstance(data, dict) or "azr_compat" not in data:
            return data
        data = dict(data)
        compat = bool(data.pop("azr_compat"))
        outside = AZR_CODE_OUTSIDE_REWARD if compat and data.get("kind") == "difficulty" else 0.0
        data.setdefault("ineligible_reward", outside)
        data.setdefault("invalid_penalty", float(data.get("format_penalty", -1.0)) / 2)
        data.setdefault("normalize", "all")  # such configs predate gated_rank
        return data

    @property
    def needs(self) -> RewardNeeds:
        """What `kind` needs from the run (`config.reward_kinds.REWARD_NEEDS`)."""
        return reward_needs(self.kind)

    @model_validator(mode="after")
    def _gates_ordered(self) -> RewardSection:
        """gated_rank z-scores the class levels: they must be strictly ordered, or two classes
        would tie and a group of them lose its contrast."""
        if self.normalize != "gated_rank":
            return self
        worst = max(self.format_penalty, self.invalid_penalty)
        if not worst < self.ineligible_reward < 0.0:
            raise ValueError(
                "reward.normalize=gated_rank needs max(reward.format_penalty, "
                f"reward.invalid_penalty) < reward.ineligible_reward < 0 (the eligible gate); "
                f"got {self.format_penalty}, {self.invalid_penalty}, {self.ineligible_reward} "
                "(set reward.normalize=all for the plain z-score of these rewards)")
        if not self.copy_reward < 0.0:
            raise ValueError(f"reward.copy_reward must be < 0 (below the eligible gate) under "
                             f"reward.normalize=gated_rank, got {self.copy_reward}")
        return self

    kind: RewardKind = Field(
        "difficulty", description="proposer reward: difficulty = AZR learnability 1 - s for "
        "0 < s < 1; cosine / inner = cosine / eta x inner product of the task's solution "
        "gradient with the reference gradient; novelty = token-Jaccard distance to its seed; "
        "cos_novelty = cosine x novelty; soar = held-out gain of a solver copy trained on it; "
        "precond_cosine = the cosine in the metric of the learner's AdamW step, "
        "<g, M g_ref> / sqrt(<g, M g> <g_ref, M g_ref>) with M = 1 / (sqrt(v_hat) + eps) from "
        "the learner's optimizer state at the scored weights (ones before the first update: "
        "the plain cosine; rewards/preconditioner.py). It needs learner.backend=torch, "
        "scorer.params within learner.trainable and not a projection, reference=global and "
        "learner.weight_sync object_store or ipc")
    eta: float = Field(1.0, gt=0.0, description="step size multiplying the inner product")
    format_penalty: float = Field(-1.0, le=0.0, description="reward of a proposal that does "
                                  "not parse (no well-formed task in it); AZR's code: -1")
    invalid_penalty: float = Field(
        -1.0, le=0.0, description="reward of a parsed proposal that fails validation (not "
        "deterministic, banned import, raises, too few inputs, ...). -1 = AZR's released code "
        "(a failed validity check zeroes its format score, and a zero format score is -1); "
        "-0.5 = 'wrong but well-formatted' in AZR's paper (this project's choice before "
        "2026-12-01)")
    ineligible_reward: float = Field(
        AZR_CODE_OUTSIDE_REWARD, le=0.0, description="reward of a valid proposal outside the "
        "band, every kind: difficulty when s is 0 or 1; the other kinds when the task is not "
        "an eligible candidate (s is 0 or 1, or no verified solution or local reference). The "
        "CompassPlay paper is silent. -0.5 = AZR's released code: learnability 1 - s is 0 for "
        "s in {0, 1} and a valid, well-formatted proposal with zero learnability gets -0.5 "
        "(checked on public mirrors of absolute_zero_reasoner/rewards/reward_managers.py, "
        "CodeIORewardManager.__call__; AZR's own repository was not readable here); 0 = AZR's "
        "paper equation (r = 0 when s is 0 or 1; this project's choice before 2026-12-01)")
    normalize: Literal["gated_rank", "all", "eligible"] = Field(
        "gated_rank", description="how proposer rewards become advantages, the same for every "
        "reward kind. gated_rank = the gate plus the rank (rewards/shaping.py): the advantage "
        "is the z-score, per task type, of the proposal's class level (unparsed "
        "format_penalty, ill-posed invalid_penalty, ineligible ineligible_reward, copy "
        "copy_reward, eligible 0), plus, for eligible tasks, rank_weight x sqrt(3)(2u - 1) "
        "with u the mid-rank of the kind's score (the cosine, 1 - s, ...) among the last "
        "rank_window eligible candidates of all types and this step's: among eligible tasks the "
        "score alone orders the advantage, and a lone eligible task is still ranked. all = "
        "the paper's plain form, AZR's Task-Relative REINFORCE++ (one z-score of the rewards "
        "per task type and role): there the penalties set the scale, the cosine carried "
        "0.16% of the proposer's advantage variance on the recorded default run and a Lean "
        "copy's reward 0 sits above a batch mean pulled down by the penalties (it is "
        "reinforced); eligible = all's class contrasts plus the eligible candidates' "
        "deviations standardized among themselves (a lone eligible task gets no score term). "
        "Measured: docs/measurements/advantage-2026-12-03")
    rank_window: int = Field(256, ge=0, description="gated_rank: eligible candidates (all task "
                             "types) whose scores a new score is ranked among, besides this "
                             "step's; 0 = this step's only. Checkpointed with the learner")
    rank_weight: float = Field(1.0, gt=0.0, le=10.0, description="gated_rank: scale of the "
                               "rank term (1 = unit variance, like the gate's z-score)")
    copy_reward: float = Field(-1.0, le=0.0, description="gated_rank: gate level of an "
                               "eligible task whose novelty factor is 0 (kinds novelty and "
                               "cos_novelty; the paper's copies, rewarded 0 'so the policy "
                               "gradient pushes them down'): -1 = the parse failures' level, "
                               "so a copy's advantage is negative in any group with another "
                               "class. Under all / eligible a copy keeps reward 0")
    novelty_tokenizer: Literal["model", "regex"] = Field(
        "model", description="tokens of the novelty Jaccard: model = the policy's tokenizer; "
        "regex = words and single punctuation characters")
    soar_groups: int = Field(4, ge=1, description="soar: candidate groups per step (used "
                             "when soar_group_size is 0)")
    soar_group_size: int = Field(0, ge=0, description="soar: candidates per group (contiguous "
                                 "chunks); 0 = split the candidates into soar_groups groups")
    soar_lr: float = Field(1e-3, gt=0.0, description="soar: step size of the inner optimizer")
    soar_inner_steps: int = Field(4, ge=1, description="soar: optimizer steps of the solver "
                                  "copy on each group (full batch: the group's solutions)")
    soar_optimizer: Literal["sgd", "adamw"] = Field("sgd", description="soar: inner optimizer")
    soar_metric: Literal["loss", "accuracy"] = Field(
        "loss", description="soar: the gain measured on the held-out problems. accuracy = "
        "greedy accuracy gain (the paper's SOAR, and baseline_soar_7b; one greedy generation "
        "per held-out problem and group); loss = drop of the held-out gold answers' "
        "cross-entropy (default, a deliberate deviation for CPU-sized solvers: a dense, cheap "
        "proxy; tiny or untrained solvers score 0 accuracy, so accuracy gains are all 0). "
        "Either way the solver copy is trained by SFT on the group's verified solutions "
        "(soar_inner_steps optimizer steps), where SOAR's student is trained by RL")
    soar_heldout: str = Field(
        "seeds", description="soar: held-out problems, disjoint from the reference set. "
        "'seeds' = the last soar_heldout_items deduction/abduction seed tasks, taken out of the "
        "task buffer (the proposer and solver never see them), posed as deduction: the "
        "default, a deliberate deviation (the coding domain, where the paper measures the "
        "target domain: set heldout_math_paper32.jsonl, disjoint from the paper's reference, "
        "as the experiments and baseline_soar_7b do); else a jsonl of {prompt, solution[, "
        "answer]} (a bare name = a file in compassplay/data)")
    soar_heldout_items: int = Field(8, ge=1, description="soar: held-out problems used "
                                    "(the first N of a jsonl; N seeds for 'seeds')")
    soar_max_new_tokens: int = Field(64, ge=1, description="soar accuracy: greedy tokens per "
                                     "held-out problem")
    reference: Literal["global", "local"] = Field(
        "global", description="gradient kinds' reference: global = the reference set "
        "(`reference.path`); local = per candidate, the solver's verified solution of the seed "
        "it was written from (environments that provide one, e.g. lean)")
    local_reference_seed: Literal["closest", "first"] = Field(
        "closest", description="reference=local with several shown seeds (coding deduction/"
        "abduction shows proposer.num_references): the seed whose solution is the candidate's "
        "reference. closest = the one novelty compares it with (largest token Jaccard on the "
        "reward.novelty_tokenizer tokens); first = the first shown (this project's choice "
        "before 2026-12-01). The paper's local reference (Lean) has one seed; AZR has none")


class ReferenceSection(Section):
    path: str = Field("", description="jsonl with {prompt, solution}; '' = shipped math set")
    max_items: int = Field(32, ge=1, description="reference items used (the first N): the "
                           "reference gradient is their mean solution-loss gradient")
