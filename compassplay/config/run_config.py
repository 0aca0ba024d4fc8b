"""`RunConfig`: every section of a run, and the checks that span sections."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from compassplay.config.infra import (
    ClusterSection,
    EvalSection,
    LoggingSection,
    PipelineSection,
    VerifierSection,
)
from compassplay.config.models import (
    BootstrapSection,
    LearnerSection,
    ModelSection,
    ProposerSection,
    RunSection,
    ScorerSection,
    SolverSection,
)
from compassplay.config.section import Section
from compassplay.config.task_reward import ReferenceSection, RewardSection, TaskSection


class RunConfig(Section):
    run: RunSection = Field(
        default_factory=RunSection,
        description="the run's name, output folder, seed and torch threads")
    model: ModelSection = Field(
        default_factory=ModelSection,
        description="the policy model: where it comes from and its dtype")
    proposer: ProposerSection = Field(
        default_factory=ProposerSection,
        description="how the proposer role samples tasks (engine, decoding, batch)")
    solver: SolverSection = Field(
        default_factory=SolverSection,
        description="how the solver role samples attempts (engine, decoding, samples per task)")
    task: TaskSection = Field(
        default_factory=TaskSection,
        description="what is proposed: the domain, task types, seed set and task checks")
    reward: RewardSection = Field(
        default_factory=RewardSection,
        description="the proposer's reward and its parameters")
    reference: ReferenceSection = Field(
        default_factory=ReferenceSection,
        description="the reference set whose gradient the gradient rewards align with")
    verifiers: VerifierSection = Field(
        default_factory=VerifierSection,
        description="the Python sandbox and the Lean verifier that check tasks and attempts")
    scorer: ScorerSection = Field(
        default_factory=ScorerSection,
        description="the gradient-alignment scorer (gradient reward kinds)")
    learner: LearnerSection = Field(
        default_factory=LearnerSection,
        description="the policy update (PPO-style), its optimizer, backend and checkpoints")
    pipeline: PipelineSection = Field(
        default_factory=PipelineSection,
        description="the number of steps, rollout staleness and step retries")
    bootstrap: BootstrapSection = Field(
        default_factory=BootstrapSection,
        description="the optional supervised format warm-up before self-play")
    eval: EvalSection = Field(
        default_factory=EvalSection,
        description="benchmark evaluation during training")
    logging: LoggingSection = Field(
        default_factory=LoggingSection,
        description="log level, progress bars, Prometheus endpoint, extra measurements")
    cluster: ClusterSection = Field(
        default_factory=ClusterSection,
        description="Ray address, per-role actor resources and placement")

    @model_validator(mode="before")
    @classmethod
    def _lean_solver_trains_on_selected(cls, data: Any) -> Any:
        """Lean (SGS's loop, not AZR's): the solver attempts the targets n_samples times each
        and trains, as SGS's code does, on the verified proofs of the tasks with
        0 < s <= solver.select_max_solve_rate, unless the config says otherwise."""
        if not isinstance(data, dict) or (data.get("task") or {}).get("domain") != "lean":
            return data
        solver = data.get("solver") or {}
        if isinstance(solver, dict):
            data = {**data, "solver": {"train_on": "selected", "seed_task_samples": 0,
                                             **solver}}
        return data

    @model_validator(mode="after")
    def _precond_cosine_fits(self) -> RunConfig:
        """reward.kind=precond_cosine scores in the metric of the learner's AdamW state, which
        travels with the weights to the scorers (checked again on the model: scorer.params
        must be trainable, `LearnerWorker`)."""
        if self.reward.kind != "precond_cosine":
            return self
        if self.learner.backend != "torch":
            raise ValueError("reward.kind=precond_cosine needs learner.backend=torch: it reads "
                             "the optimizer's exp_avg_sq per parameter, which DeepSpeed's ZeRO "
                             "partitions over ranks and flat buffers (not read here)")
        if self.scorer.params.strip().startswith("proj:"):
            raise ValueError("reward.kind=precond_cosine scores exactly: scorer.params must be "
                             "'all', 'last:K' or name globs, not a projection")
        if self.reward.reference != "global":
            raise ValueError("reward.kind=precond_cosine needs reward.reference=global (the "
                             "local-reference partials take no metric)")
        if self.learner.weight_sync == "nccl":
            raise ValueError("reward.kind=precond_cosine: the metric travels with the scorers' "
                             "weights snapshot; learner.weight_sync=nccl broadcasts weights "
                             "only (use object_store or ipc)")
        return self

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
        for r in ("proposer", "solver"):
            sec = getattr(self, r)
            if sec.engine != "vllm" and (sec.tensor_parallel_size != 1
                                         or sec.enable_sleep_mode):
                raise ValueError(f"{r}.tensor_parallel_size / {r}.enable_sleep_mode are "
                                 f"vllm options, but {r}.engine={sec.engine}")
        return self
