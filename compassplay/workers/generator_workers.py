"""The proposer and solver workers: each samples with its own generation engine."""

from __future__ import annotations

from compassplay.config import RunConfig, SamplingSection
from compassplay.engines.generation.vllm import VLLMGenerationEngine
from compassplay.step import stages
from compassplay.step.graph import StageCall, WeightsOffer
from compassplay.step.messages import (
    AttemptBatch,
    GradeBatch,
    Proposals,
    Validated,
)
from compassplay.step.timing import timed
from compassplay.warmup.bootstrap import bootstrap_weights, load_policy
from compassplay.workers.builders import (
    configure_process,
    frozen_states_layer,
    load_tokenizer,
    make_env,
    make_generator,
    role_device,
    role_gpus,
)
from compassplay.workers.versioned import Versioned, Weights


class _GeneratorWorker(Versioned):
    """A role that samples with its own generation engine (sampling settings: `section`).

    A vLLM role loads no HF model (vLLM loads `model.name_or_path` itself; the role only needs
    its tokenizer) and takes weights in its engine's workers: NCCL broadcast, CUDA IPC from a
    colocated learner, or the object store (the engine sends the tensors in vLLM's RPC). With
    `enable_sleep_mode` it sleeps after each generation stage."""

    def __init__(self, cfg: RunConfig, section: SamplingSection, role: str) -> None:
        self.cfg, self.section = cfg, section
        self.gpus = role_gpus(cfg, role)
        configure_process(cfg)
        if section.engine == "vllm":
            model, self.tok = None, load_tokenizer(cfg)
        else:
            model, self.tok = load_policy(cfg)  # base model (+ bootstrap)
        self.engine = make_generator(cfg, section, model, self.tok, role_device(cfg, role),
                                     capture_layer=frozen_states_layer(cfg, model))
        if self.vllm:
            boot = bootstrap_weights(cfg, self.tok)  # vLLM loaded the base model
            if boot is not None:
                self.engine.load_weights(boot, 0)
        self.env = make_env(cfg, None)

    @property
    def vllm(self) -> bool:
        return isinstance(self.engine, VLLMGenerationEngine)

    def load_weights(self, weights: Weights, version: int) -> None:
        self.engine.load_weights(weights, version)

    def take_states(self) -> dict:
        """The hidden states kept for the learner during the last stage (`engines.
        frozen_states`; empty where the engine keeps none)."""
        take = getattr(self.engine, "take_states", None)
        return take() if take is not None else {}

    def after_generation(self) -> None:
        """Give the GPU back to a colocated learner (vLLM sleep mode)."""
        if self.vllm and self.section.enable_sleep_mode:
            self.engine.sleep(self.section.sleep_level)

    def init_sync(self, addr: str, port: int, rank: int, world_size: int) -> None:
        """`rank`: this role's rank offset; a vLLM engine's TP workers take rank ..
        rank + TP - 1 (`sync.ranks.weight_sync_ranks`)."""
        if self.vllm:
            self.engine.init_weight_broadcast(addr, port, rank, world_size)
        else:
            super().init_sync(addr, port, rank, world_size)

    def receive(self, version: int | None = None) -> int:
        """Take the broadcast the learner sends now (`version`: the one announced; None:
        the broadcast's own, refused if older than the one held); returns the version held."""
        if not self.vllm:
            return super().receive(version)
        # vLLM receives in its workers, loads in place and refuses older versions itself
        self.engine.receive_weights_broadcast(version, src=0,
                                              bucket_bytes=self.cfg.learner.sync_bucket_mb << 20)
        self.weight_version = self.engine.weight_version
        return self.weight_version

    def receive_ipc(self, update: tuple[int, str]) -> int:
        """learner.weight_sync=ipc: load the learner's CUDA IPC handles ((version, path) of
        `LearnerWorker.publish_ipc`); returns the version held."""
        version, path = update
        if not self.vllm:
            raise RuntimeError("receive_ipc on a role without a vLLM engine")
        if version > self.weight_version:
            self.engine.load_weights_ipc(path, version)
            self.weight_version = self.engine.weight_version
        return self.weight_version


class ProposerWorker(_GeneratorWorker):
    """Writes proposals with its own copy of the weights; owns the environment's task buffer."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg, cfg.proposer, "proposer")

    def propose(self, call: StageCall, weights: WeightsOffer) -> Proposals:
        """This step's proposals (every task type, batch_size each) and the buffer tasks the
        solver also attempts."""
        self.accept(weights)
        with timed(self.gpus) as t:
            out = stages.propose(self.env, self.engine, self.tok, self.cfg, call.step)
        self.after_generation()
        return Proposals(call.step, out.tasks, out.seed_tasks, t, self.take_states())

    def update_buffer(self, call: StageCall, slices: list[Validated]) -> int:
        """The buffer update, a stage of its own: this step's valid proposed tasks join
        (from the verifiers' slices, in part order: it need not wait for `collect`)."""
        return self.env.add_to_buffer([t for p in slices for t in p.tasks if t.valid])

    def record_proofs(self, call: StageCall, validated: Validated, attempts: AttemptBatch,
                      grades: list[GradeBatch]) -> dict[str, float]:
        """After grading (lean runs): proved targets join the buffer; returns the
        environment's step metrics (coverage)."""
        solved = validated.solved
        graded = GradeBatch.merge(grades, solved)
        return self.env.record_results(solved, attempts.attempts, graded.verdicts)

    def env_state(self, call: StageCall, added: int, recorded: dict | None = None) -> dict:
        """The environment's checkpoint state (its buffer) after this step's update."""
        return self.env.state_dict()

    def load_env_state(self, state: dict | None) -> None:
        """Restore a checkpointed environment state (None: the fresh seed buffer)."""
        self.env = make_env(self.cfg, None)
        if state is not None:
            self.env.load_state_dict(state)


class SolverWorker(_GeneratorWorker):
    """Samples n attempts per task with its own copy of the weights."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg, cfg.solver, "solver")

    def collect(self, call: StageCall, slices: list[Validated]) -> Validated:
        """The verifiers' slices merged once for the step (every later stage takes this)."""
        return Validated.merge(slices)

    def solve(self, call: StageCall, weights: WeightsOffer,
              validated: Validated) -> AttemptBatch:
        """n attempts per task the solver attempts (`validated.solved`)."""
        self.accept(weights)
        with timed(self.gpus) as t:
            attempts = stages.solve(self.env, self.engine, self.tok, self.cfg, validated.solved,
                                    call.step, {s.task_id for s in validated.seed_tasks})
        self.after_generation()
        return AttemptBatch(attempts, t, self.take_states())
