"""`RunConfig`: every section of a run, and the checks that span sections."""

from __future__ import annotations

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
