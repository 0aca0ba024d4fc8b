"""The learner worker: rewards, policy update, checkpoints; the source of weight versions."""

from __future__ import annotations

import copy
import fnmatch
from functools import partial
from pathlib import Path

import torch

from compassplay.config import ConfigError, RunConfig
from compassplay.engines.factory import make_learner
from compassplay.engines.training.advantages import proposer_score_share
from compassplay.engines.training.dist import RankInfo, rendezvous
from compassplay.plan.memory import colocated
from compassplay.records import StepStats
from compassplay.rewards.batch import mean_example_loss
from compassplay.rewards.shaping import ScoreWindow, gate_levels, shape
from compassplay.rundir.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from compassplay.step import stages
from compassplay.step.graph import STEP, StageCall
from compassplay.step.messages import (
    AttemptBatch,
    GradeBatch,
    Proposals,
    ScoredShard,
    StepResult,
    Validated,
)
from compassplay.step.prompting import novelty_tokens
from compassplay.step.scoring import merge_shards, merge_soar, merge_utility
from compassplay.step.timing import Timing, step_cost, timed
from compassplay.sync import identity
from compassplay.sync.channel import NcclChannel, open_channel
from compassplay.sync.ipc import publish
from compassplay.sync.packed import PackArena, PackedWeights, layout
from compassplay.warmup.bootstrap import load_policy
from compassplay.workers.builders import (
    configure_process,
    freeze_except,
    make_env,
    make_reference,
    param_globs,
    role_device,
    role_gpus,
)
from compassplay.workers.versioned import Weights, with_metric

ROLE_OF = {st.name: st.role for st in STEP}


def is_checkpoint_step(cfg: RunConfig, step: int) -> bool:
    return (step + 1) % cfg.learner.checkpoint_every == 0 or step + 1 == cfg.pipeline.steps


class LearnerWorker:
    """Assigns rewards, updates the policy, checkpoints; the source of weight versions.

    Checkpoint `k` is written inside `learn(k)` (atomically, every `checkpoint_every` steps and
    at the last step) and holds: learner state, the environment state the proposer (the
    buffer's owner) handed over after step k's buffer update (the `env_state` stage), and the
    StepStats since the previous checkpoint (so a driver killed before writing its metrics
    lines loses none). A restarted learner actor restores the latest checkpoint in its
    constructor.

    Learner group (`learner.num_ranks` > 1, `dist` = this rank): every rank gets the same
    calls (learn, snapshot, broadcast, restore) and runs them together; rank 0's results are
    the group's (the others return no weights and write no checkpoint files).
    """

    channel: NcclChannel | None = None  # learner.weight_sync=nccl, after init_sync

    def __init__(self, cfg: RunConfig, run_dir: str, restore: bool = False,
                 dist: RankInfo | None = None) -> None:
        self.cfg, self.dist = cfg, dist
        self.rank = dist.rank if dist is not None else 0
        self.run_dir = Path(run_dir)
        configure_process(cfg)
        self.model, self.tok = load_policy(cfg)  # base model (+ bootstrap)
        self.model.to(role_device(cfg, "learner"))  # before the optimizer is built
        freeze_except(self.model, cfg.learner.trainable, "learner.trainable")
        self._initial = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        # learner.kl_coef > 0: the KL term's frozen reference is the initial policy
        self.ref_model = frozen_copy(self.model) if cfg.learner.kl_coef > 0 else None
        self.learner = make_learner(cfg.learner, self.model, self.ref_model,
                                    total_steps=cfg.pipeline.steps, dist=self.dist)
        # reward.kind=precond_cosine: the scored parameters, whose metric the scorers get
        self.metric_names = (metric_names(cfg, self.model)
                             if cfg.reward.needs.metric else [])
        self.env = make_env(cfg, None)
        self.reference = make_reference(cfg, self.tok) if cfg.logging.reference_loss else None
        self.steps_done = 0
        self.version_offset = 0
        self.recent: list[StepStats] = []
        self.restored_state: dict | None = None
        self.gpus = role_gpus(cfg, "learner")
        # colocated with engines that wake after each update (run/memory_plan.colocated): give
        # torch's cached blocks back at the end of every learn() (`release_cached_memory`)
        self.release_cache = role_device(cfg, "learner").type == "cuda" and colocated(cfg)
        self.cumulative_device_seconds = 0.0  # training's device seconds so far
        # reward.normalize=gated_rank: recent eligible scores (rewards.shaping), checkpointed
        self.score_window = ScoreWindow(cfg.reward.rank_window)
        if restore:
            self.restore()

    @property
    def weight_version(self) -> int:
        return self.learner.weight_version + self.version_offset

    def weights(self, role: str = "solver") -> Weights:
        return self.learner.state_dict_for_sync(role)

    def reserve_snapshots(self, arena: PackArena) -> int:
        """Allocate and fault in `arena` for a packed snapshot of the solver's weights now
        (start-up), not in the first snapshot on a step's path; returns its bytes. 0 (nothing
        reserved) under learner.weight_sync=nccl, whose receivers take broadcasts: a 7B
        model's buffer would hold 15 GB of host memory for the odd eval snapshot."""
        if self.cfg.learner.weight_sync == "nccl":
            return 0
        nbytes = layout(self.learner.weights_view("solver"))[2]
        arena.reserve(nbytes)
        return nbytes

    def snapshot(self, role: str = "solver", arena: PackArena | None = None
                 ) -> tuple[int, PackedWeights]:
        """(the version the learner reports, its weights for `role`'s engines packed in one
        buffer: `sync.packed`, which Ray's object store takes without pickling tensor by
        tensor). Role "scorer": the solver's weights, plus under reward.kind=precond_cosine
        the optimizer's metric of the scored parameters at those weights (`with_metric`),
        read in the same call. `arena`: reuse its buffer (the previous pack is overwritten).

        Version 0 carries no tensors: it is the policy every role builds for itself, and a
        receiver takes only a version newer than the one it holds (`Versioned.accept`). The
        run's first snapshot is on the first proposal's path (Ray resolves the version before
        the call), where packing would cost 0.1-1 s for bytes nobody reads."""
        if self.weight_version == 0:
            return 0, PackedWeights.pack({})
        weights = self.learner.weights_view("solver" if role == "scorer" else role)
        if role == "scorer" and self.metric_names:
            weights = with_metric(weights, self.learner.preconditioner(self.metric_names))
        return self.weight_version, PackedWeights.pack(weights, arena)

    # learner.weight_sync=nccl: the learner is rank 0 of the weight-sync group
    def sync_address(self) -> tuple[str, int]:
        """(this node's IP, a free port) for the group's store."""
        return rendezvous()

    def init_sync(self, addr: str, port: int, world_size: int) -> None:
        self.channel = open_channel(self.cfg, addr, port, 0, world_size)

    def broadcast(self, version: int | None = None) -> int:
        """Send the current (shared-model) weights as `version` (default: weight_version)."""
        version = self.weight_version if version is None else version
        if self.rank > 0:  # take part in the gather (ZeRO-3); rank 0 sends
            self.weights("solver")
            return version
        if self.channel is None:
            raise RuntimeError("broadcast() before init_sync()")
        self.channel.send(self.weights("solver"), version)
        return version

    # learner.weight_sync=ipc: colocated vLLM engines open CUDA IPC handles of the weights
    def publish_ipc(self) -> tuple[int, str]:
        """Publish the current (shared-model) weights on this learner's GPU as CUDA IPC
        handles (`sync.ipc`); returns (version, handle file). The handles point at the live
        parameters (`ipc_weights`: no copy, as vLLM's IPC engine shares them); they stay
        valid and unchanged until `release_ipc`, which the driver calls after every receiver
        loaded them: Ray runs this actor's calls in order, so the next learn() starts after
        it."""
        self.release_ipc()
        device = role_device(self.cfg, "learner")
        if device.type != "cuda":
            raise RuntimeError("learner.weight_sync=ipc: the learner has no GPU "
                               "(cluster.learner.num_gpus > 0 and CUDA are needed)")
        state = ipc_weights(self.model, self.cfg.learner, device,
                            lambda: self.weights("solver"))
        # the engines wake (weights, then KV cache) right after this: hand back the blocks
        # the learner's step left cached (DeepSpeed's partition cache, torch's allocator)
        self.release_cached_memory(always=True)
        self._ipc = publish({identity.device_id(device): state}, self.weight_version)
        return self.weight_version, self._ipc.path

    def release_ipc(self, *loaded: int) -> None:
        """Drop the published handles (`loaded`: the receivers' results, waited on by Ray)."""
        if getattr(self, "_ipc", None) is not None:
            self._ipc.close()
            self._ipc = None

    def restore(self, min_version: int = 0) -> dict | None:
        """Reload the latest checkpoint (or the initial weights when there is none); weight
        versions stay >= `min_version` so engines holding newer versions accept the rollback."""
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            self.learner.reset(self._initial)  # in place: ZeRO-3 parameters are partitioned
            self.steps_done, self.restored_state = 0, None
            self.cumulative_device_seconds = 0.0
            self.score_window = ScoreWindow(self.cfg.reward.rank_window)
        else:
            self.restored_state = load_checkpoint(ckpt, self.learner)
            self.steps_done = self.restored_state["step"] + 1
            recent = self.restored_state.get("recent_stats") or [{}]
            self.cumulative_device_seconds = float(
                recent[-1].get("cumulative_device_seconds", 0.0))
            self.score_window = ScoreWindow(self.cfg.reward.rank_window)
            self.score_window.load_state_dict(self.restored_state.get("score_window") or {})
        self.version_offset = max(0, min_version - self.learner.weight_version)
        self.recent = []
        return self.restored_state

    def learn(self, call: StageCall, proposals: Proposals, env_state: dict | None,
              validated: Validated, attempts: AttemptBatch, grades: list[GradeBatch],
              shards: list[ScoredShard], recorded: dict | None = None) -> StepResult:
        """Rewards -> trajectories -> one policy update -> the step's metrics (+ checkpoint)."""
        props, batch = proposals, validated
        if props.step != self.steps_done:
            raise RuntimeError(f"learner expected step {self.steps_done}, got {props.step}")
        graded = GradeBatch.merge(grades, batch.solved)
        param_shard = self.cfg.scorer.shard_mode == "param_shard"
        cands, alignment = merge_shards(shards, param_shard)
        scores = stages.assign_rewards(self.cfg.reward, batch.tasks, graded.rates, cands,
                                       alignment, merge_utility(shards))
        train = ({t.task_id for t in props.seed_tasks}
                 if self.cfg.solver.train_on == "buffer" else None)
        selected = self.cfg.solver.select_max_solve_rate \
            if self.cfg.solver.train_on == "selected" else None
        trajs = stages.make_trajectories(self.env, batch.tasks + props.seed_tasks,
                                         attempts.attempts, graded.verdicts, scores,
                                         self.cfg.reward.normalize, train, selected,
                                         self._shaped(scores))
        with timed(self.gpus) as learn_timing:
            lstats = self.learner.step(trajs, {**props.states, **attempts.states})
        lstats.weight_version = self.weight_version
        timings = {"propose": props.timing, "validate": batch.timing, "solve": attempts.timing,
                   "grade": graded.timing, "score": Timing.merge([s.timing for s in shards]),
                   "learn": learn_timing}
        cost = step_cost(timings, ROLE_OF, self.cumulative_device_seconds)
        cost.update(merge_soar(shards))
        self.cumulative_device_seconds = cost["cumulative_device_seconds"]
        tokenize = partial(novelty_tokens, self.tok, kind=self.cfg.reward.novelty_tokenizer)
        domain = {**self.env.step_metrics(batch.tasks, graded.rates, scores, tokenize),
                  **(recorded or {})}
        stats = stages.summarize(props.step, batch.tasks, graded.rates, attempts.attempts,
                                 graded.verdicts, scores, lstats, cost, domain or None)
        stats.score_advantage_share = proposer_score_share(
            trajs, {s.task_id for s in scores if s.eligible})
        if self.reference is not None:
            stats.reference_loss = mean_example_loss(
                self.model, self.reference, self.tok.pad_token_id,
                self.cfg.scorer.max_batch_tokens)
        self.steps_done += 1
        self.recent.append(stats)
        ckpt = ""
        if is_checkpoint_step(self.cfg, props.step):
            ckpt = self._checkpoint(props.step, env_state)
        self.release_cached_memory()
        return StepResult(stats, self.weight_version,
                          {"checkpoint": ckpt, "samples": stages.samples(props.step, batch.tasks,
                                                                         scores)})

    def _shaped(self, scores: list) -> dict | None:
        """reward.normalize=gated_rank: each proposal's gate level and rank direction (the
        eligible scores then join the window); None otherwise."""
        r = self.cfg.reward
        if r.normalize != "gated_rank":
            return None
        levels = gate_levels(r.format_penalty, r.invalid_penalty, r.ineligible_reward,
                             r.copy_reward)
        return shape(scores, levels, self.score_window, r.rank_weight)

    def release_cached_memory(self, always: bool = False) -> None:
        """Hand the blocks kept cached after the step (activations, gathered parameters) back
        to the driver, when the learner shares its GPU with engines (`plan.memory.
        colocated`; `always`: whenever the learner is on a GPU): DeepSpeed's ZeRO-3
        partition cache first (`engine.empty_partition_cache()`, the gathered parameters
        torch's allocator alone cannot free), then torch's cache. Order: this runs at the end
        of `learn()`; with pipeline.staleness 0 every engine wake-up follows it, since a
        sleeping vLLM engine wakes in its next generate() or in a weight load, both of which
        wait for this update's weights (a snapshot, broadcast or publish_ipc call the learner
        runs after learn() returned). The memory plan then counts only the learner's resident
        state (weights, gradients, optimizer) while engines generate; with staleness > 0
        rollout overlaps learning and the plan counts the engines awake throughout."""
        if not (self.release_cache or always and torch.cuda.is_available()):
            return
        for slot in getattr(self.learner, "slots", {}).values():
            release = getattr(slot, "release_memory", None)
            if release is not None:
                release()
        torch.cuda.empty_cache()  # GPU only (release_cache needs a CUDA learner)

    def _checkpoint(self, step: int, env_state: dict | None) -> str:
        if env_state is None:
            raise RuntimeError(f"step {step} is a checkpoint step but no environment state "
                               "came with it (the env_state stage was not submitted)")
        if self.rank > 0:  # the collective part of rank 0's save; no files
            self.learner.save(None)
            self.recent = []
            return ""
        state = {"step": step, "env": env_state,
                 "recent_stats": [s.model_dump(mode="json") for s in self.recent],
                 "score_window": self.score_window.state_dict()}
        path = save_checkpoint(self.run_dir, step, self.learner, state,
                               keep_last=self.cfg.learner.keep_last, tokenizer=self.tok)
        self.recent = []
        return str(path)


def metric_names(cfg: RunConfig, model: torch.nn.Module) -> list[str]:
    """The parameters the scorers score (`scorer.params`, on the learner's model; tied weights
    once, as `named_parameters` lists them), all of which the learner must train: their
    AdamW state is the precond_cosine metric. ConfigError naming scorer.params otherwise."""
    spec = cfg.scorer.params
    globs = param_globs(spec, model) or ["*"]
    if cfg.scorer.shard_mode == "param_shard" and cfg.scorer.num_scorers > 1:
        spec, globs = "all (scorer.shard_mode=param_shard shards every parameter)", ["*"]
    named = [(n, p) for n, p in model.named_parameters()
             if any(fnmatch.fnmatchcase(n, g) for g in globs)]
    if not named:
        raise ConfigError(f"scorer.params={spec!r}: no parameter of the model matches {globs}")
    frozen = [n for n, p in named if not p.requires_grad]
    if frozen:
        raise ConfigError(
            f"reward.kind=precond_cosine: scorer.params={spec!r} selects {len(frozen)} "
            f"parameter(s) the learner does not train (learner.trainable="
            f"{cfg.learner.trainable!r}), e.g. {frozen[:3]}: they have no optimizer state; "
            "make scorer.params a subset of learner.trainable")
    return [n for n, _ in named]


def ipc_weights(model: torch.nn.Module, lc, device: torch.device,
                full_state) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor on `device`) of the weights a CUDA IPC publish shares: the live
    parameters and buffers of `model` (HF names, detached: no copy) wherever they are whole
    on the GPU (torch backend; DeepSpeed below ZeRO-3); under ZeRO-3 (partitioned, or
    offloaded) the gathered `full_state()` (CPU copies) moved to `device`. `lc`: the
    learner section."""
    if lc.backend == "deepspeed" and (lc.zero_stage == 3 or lc.offload_params):
        return [(k, v.to(device)) for k, v in full_state().items()]
    return [(k, v.detach().to(device)) for k, v in model.state_dict().items()]


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` without gradients, in eval mode (the KL reference)."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def restored_env_state(state: dict) -> dict:
    """The environment state (the proposer's buffer) of a restored checkpoint."""
    return state["env"]


def restored_metrics(state: dict) -> tuple[int, list[StepStats]]:
    """(lines of metrics.jsonl to keep, StepStats to append) after restoring `state`."""
    recent = [StepStats.model_validate(s) for s in state["recent_stats"]]
    return state["step"] + 1 - len(recent), recent
