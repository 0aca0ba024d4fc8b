"""Sections of where and how a run executes: verifiers (sandbox, Lean fleet), the pipeline,
evaluation during training, logging and the cluster's actor resources."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from compassplay.config.section import Section


class ActorResources(Section):
    """The Ray resources one actor asks for (Ray executor; the local executor ignores them)."""

    num_cpus: float = Field(1.0, ge=0.0, description="CPUs reserved for the actor (Ray "
                            "logical CPUs; fractions share a core)")
    num_gpus: float = Field(0.0, ge=0.0, description="GPUs reserved for the actor (fractions "
                            "share a GPU); > 0 puts the role on CUDA")
    resources: dict[str, float] = Field(default_factory=dict, description="custom Ray "
                                        "resources the actor needs, e.g. {lean_repl: 1}")


class LeanActorResources(ActorResources):
    """One LeanVerifier actor's Ray resources: `lean_repl` unless set otherwise, so a partial
    override (`verifiers.lean.actor.num_cpus=0.25`) keeps it; `{}` lands on any node."""

    resources: dict[str, float] = Field(
        default_factory=lambda: {"lean_repl": 1.0}, description="custom Ray resources of one "
        "LeanVerifier actor; nodes with Lean and Mathlib advertise `lean_repl`")


class LeanScalingSection(Section):
    """How many LeanVerifier actors run (compassplay/verifiers/lean/scaling.py)."""

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
    """Lean 4 REPL verifier (leanprover-community/repl), see compassplay/verifiers/lean/repl_pool.py."""

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
    scaling: LeanScalingSection = Field(default_factory=LeanScalingSection,
                                        description="how many LeanVerifier actors run (fleet)")
    backend: Literal["fleet", "local"] = Field(
        "fleet", description="Ray executor: fleet = verifier actors send their Lean checks to a "
        "LeanFleet (LeanVerifier actors asking `actor`, sized by `scaling`); local = "
        "each verifier actor owns a pool of `processes` REPLs. The local executor is always local")
    resource_wait_s: float = Field(
        900.0, ge=0.0, description="fleet: seconds checks wait for a LeanVerifier actor to be "
        "placed (no node with a free `actor.resources`) before `on_no_resource` applies; "
        "pending actors are logged every 10 s; 0 = wait forever (an autoscaler adds Lean nodes)")
    on_no_resource: Literal["fail", "local"] = Field(
        "fail", description="fleet, after resource_wait_s: fail the run with a message naming "
        "the resource, or fall back to a local pool in each verifier actor")


class VerifierSection(Section):
    workers: int = Field(2, ge=1, description="sandbox worker processes per verifier (checks "
                         "run in parallel up to this)")
    timeout_s: float = Field(5.0, gt=0.0, description="wall-clock limit of one program run "
                             "in the Python sandbox (s)")
    memory_mb: int = Field(512, ge=32, description="memory cap of one sandboxed program run "
                           "(MiB; RLIMIT_AS plus a watchdog): above it the check is 'memory'")
    max_output_bytes: int = Field(65536, ge=64, description="output one program run may "
                                  "write (bytes); more ends the check as 'output_limit'")
    isolation: str = Field("bwrap", description="bwrap (root mode when root, else rootless: an "
                           "unprivileged user namespace) | bwrap-root | bwrap-userns | "
                           "none-UNSAFE-trusted-local-debugging-only")
    lean: LeanSection = Field(default_factory=LeanSection, description="the Lean 4 REPL "
                              "verifier (task.domain=lean)")


class PipelineSection(Section):
    steps: int = Field(2, ge=1, description="self-play steps of the run (each: propose, "
                       "solve, verify, score, learn)")
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
    progress: bool = Field(True, description="tqdm progress bars for steps and stages")
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Python logging level of the driver and of every actor (an "
        "actor's lines reach the driver's console through Ray's log forwarding)")
    tensorboard: bool = Field(True, description="TensorBoard event files in the run directory "
                              "with every scalar of metrics.jsonl (`tensorboard --logdir "
                              "runs`: one TensorBoard run per run directory)")
    wandb: bool = Field(False, description="also log every scalar of metrics.jsonl to wandb, in "
                        "offline mode under RUN_DIR/wandb (upload with `wandb sync`); needs "
                        "wandb installed (it is not a dependency)")
    wandb_project: str = Field("compassplay", description="wandb project name (logging.wandb)")
    reference_loss: bool = Field(False, description="after each update the learner logs the "
                                 "solver's mean loss on the reference set (StepStats."
                                 "reference_loss, nats/token): one no-grad forward over "
                                 "reference.max_items items, the same measure for every reward")


class ClusterSection(Section):
    address: str = Field("", description="Ray address; '' = RAY_ADDRESS or an embedded local Ray")
    proposer: ActorResources = Field(default_factory=ActorResources,
                                     description="the proposer's generation actor")
    solver: ActorResources = Field(default_factory=ActorResources,
                                   description="the solver's generation actor")
    verifier: ActorResources = Field(default_factory=lambda: ActorResources(num_cpus=0.5),
                                     description="each verifier actor (num_verifiers of them)")
    scorer: ActorResources = Field(default_factory=ActorResources,
                                   description="each scorer actor (scorer.num_scorers of them)")
    learner: ActorResources = Field(default_factory=ActorResources,
                                    description="each learner rank (learner.num_ranks of them)")
    eval: ActorResources = Field(default_factory=lambda: ActorResources(num_cpus=0.25),
                                 description="the eval actor (only with eval.every_steps > 0)")
    num_verifiers: int = Field(1, ge=1, description="verifier actors sharing the load")
    gpu_memory_gib: float = Field(
        80.0, gt=0.0, description="memory of each GPU (GiB) the memory plan checks the roles "
        "placed on it against (`compassplay run --dry-run`, plan/memory.py): 80 for "
        "A100/H100 80GB, 141 for H200")
    placement: Literal["none", "pack_scorers_with_learner"] = Field(
        "none", description="pack_scorers_with_learner: one STRICT_PACK placement group")
    dashboard: bool = Field(True, description="an embedded Ray (no cluster.address) starts "
                            "the Ray dashboard and prints its URL; the environment variable "
                            "COMPASSPLAY_RAY_DASHBOARD=0 turns it off (the test suite does)")
    dashboard_host: str = Field("127.0.0.1", description="the embedded Ray dashboard's bind "
                                "address; 0.0.0.0 to reach it from another host")
    dashboard_port: int = Field(8265, ge=1, le=65535, description="the embedded Ray dashboard's "
                                "port; when taken, the next free one (up to 20 on) is used and "
                                "printed")
    startup_timeout_s: float = Field(
        900.0, ge=0.0, description="seconds to wait for every actor to be placed and built "
        "(pending ones are logged every 10 s); 0 = wait forever (an autoscaler adds nodes)")
