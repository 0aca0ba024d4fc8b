"""What each role placed on a GPU holds there (pure: no Ray, no torch): `RoleMemory` and the
estimates of the engines, learner ranks and scorers; `plan.memory` checks the roles that share
a GPU.

Per role, in bytes on each of its GPUs (P parameters, Wm bytes per `model.dtype` element):

* vLLM engine: vLLM reserves `gpu_memory_utilization` x the GPU's *total* memory (its own
  accounting: weights, working memory, KV cache), or weights + `VLLM_WORKING_BYTES` +
  `kv_cache_mb` when that is set; the KV cache must hold one sequence of the role's context.
  Asleep (sleep mode, level 1: weights offloaded to CPU; level 2: dropped) it holds nothing.
  NCCL weight sync stages buckets beside it (`sync_staging`): a tensor larger than
  `learner.sync_bucket_mb` travels in a bucket of its own, and vLLM's layerwise loader keeps
  every loaded tensor until its layer completes, so max(bucket, largest tensor) + one bucket
  (Qwen2.5-7B: the 1.02 GiB embedding and head, 4x the 256 MiB default).
* HF engine: weights + the KV cache of the whole batch at the role's context.
* learner rank: weights, gradients and AdamW state (DeepSpeed in bf16/fp16: fp32 master +
  2 fp32 moments = 12 bytes/param; torch AdamW: 2 moments in the parameters' dtype), sharded
  over `learner.num_ranks` by ZeRO (stage >= 1 the optimizer, >= 2 the gradients, 3 the
  weights, which gathers up to `ZERO3_LIVE_PARAMS` at a time; one gradient reduce bucket),
  plus the activations of one micro-batch of `micro_batch` sequences of the longest context
  (`Shape.activation_bytes_per_token`), a KL reference copy, and the weight publish (NCCL:
  a bucket, at least the largest tensor, and its device copies; CUDA IPC: nothing, the live
  parameters are shared, except under ZeRO-3, where the gathered copy is).
* scorer: weights (`scorer.dtype`) + the float32 reference gradient of its parameter share
  (SOAR: a trained copy, its gradients and AdamW moments) + one pass's activations
  (`max_batch_tokens`, or a whole solver sequence when longer).
* every process on a GPU: `plan.memory.CUDA_CONTEXT_BYTES`.

Estimates, not measurements: the activation formula is within 4% of the GPU check's scorer
peak at Qwen2.5-7B (docs/measurements/h200-2026-11-30).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compassplay.config import ConfigError, RunConfig
from compassplay.plan.shapes import Shape

GiB = 1 << 30
MiB = 1 << 20
VLLM_WORKING_BYTES = 2 * GiB  # vLLM's non-KV memory: profile-run activations, CUDA graphs
ZERO3_LIVE_PARAMS = 10**9  # DeepSpeed's stage3_max_live_parameters (its default)
DS_BUCKET_ELEMENTS = 5 * 10**8  # DeepSpeed's reduce_bucket_size (its default, elements)
SCORER_CHUNK_BYTES = 64 * MiB  # GradientScorer's chunk_bytes (per-sample temporaries)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PHASES = ("generate", "score", "learn", "sync")


def gib(n: float) -> float:
    return round(n / GiB, 2)


@dataclass
class RoleMemory:
    """One actor's memory on each of its GPUs: a breakdown and the bytes in each phase."""

    name: str  # learner-0, scorer-1, proposer, ...
    num_gpus: float  # cluster.<role>.num_gpus
    parts: dict[str, int]  # label -> bytes (the breakdown printed in the plan)
    phases: dict[str, int]  # phase -> bytes held in it
    knob: str  # the config field to change when its GPU does not fit
    processes: int = 1  # CUDA contexts it opens on each of its GPUs
    start_extra: int = 0  # free memory its start asks for beyond what it then holds (vLLM)

    def to_dict(self) -> dict[str, Any]:
        return {"num_gpus": self.num_gpus, "gib": {k: gib(v) for k, v in self.parts.items()},
                "phases_gib": {k: gib(v) for k, v in self.phases.items()}}


# ------------------------------------------------------------------------------ roles
def sequence_tokens(cfg: RunConfig, shape: Shape, role: str) -> int:
    """Longest sequence (prompt + reply tokens) the role produces: `max_model_len` of a vLLM
    role, else the model's context."""
    sec = getattr(cfg, role)
    return sec.max_model_len if sec.engine == "vllm" and sec.max_model_len else shape.context


def _trainable(shape: Shape, spec: str) -> int:
    """Parameters of a 'all' / 'last:K' / globs / 'proj:DIM' spec (globs, proj: all)."""
    spec = spec.strip()
    if spec.startswith("last:"):
        return shape.last_blocks_params(int(spec.split(":", 1)[1]))
    return shape.params()


def bucket_bytes(cfg: RunConfig, shape: Shape) -> int:
    """The largest bucket a broadcast sends: `learner.sync_bucket_mb`, or the largest tensor
    when it is bigger (it gets a bucket of its own, `sync.buckets`)."""
    wb = DTYPE_BYTES[cfg.model.dtype]
    return max(cfg.learner.sync_bucket_mb * MiB, shape.largest_tensor_params() * wb)


def receiver_staging(cfg: RunConfig, shape: Shape, vllm: bool) -> int:
    """GPU bytes a weight-sync receiver stages beside its model (nccl; else 0). HF roles and
    scorers copy each bucket out to the CPU as it arrives: one bucket. vLLM's layerwise
    reload keeps the tensors of a layer until it completes, so the bucket of the largest
    tensor may still be held when the next bucket arrives: that bucket + one more."""
    if cfg.learner.weight_sync != "nccl":
        return 0
    big = bucket_bytes(cfg, shape)
    return big + cfg.learner.sync_bucket_mb * MiB if vllm else big


def _awake_always(cfg: RunConfig, role: str) -> bool:
    """The engine holds its memory in every phase: no sleep mode, or rollout overlapping
    scoring and learning (pipeline.staleness > 0)."""
    return not getattr(cfg, role).enable_sleep_mode or cfg.pipeline.staleness > 0


def vllm_role(cfg: RunConfig, shape: Shape, role: str, gpu_bytes: int) -> RoleMemory:
    """A vLLM engine's reservation per GPU; ConfigError when it leaves no room for one
    sequence's KV cache."""
    sec = getattr(cfg, role)
    wb = DTYPE_BYTES[cfg.model.dtype]
    weights = shape.params() * wb // sec.tensor_parallel_size
    start = int(sec.gpu_memory_utilization * gpu_bytes)  # vLLM's startup check, always
    if sec.kv_cache_mb:
        knob, kv = f"{role}.kv_cache_mb", sec.kv_cache_mb * MiB
        budget = weights + VLLM_WORKING_BYTES + kv
    else:
        knob = f"{role}.gpu_memory_utilization"
        budget = int(sec.gpu_memory_utilization * gpu_bytes)
        kv = budget - weights - VLLM_WORKING_BYTES
    seq = sequence_tokens(cfg, shape, role)
    per_seq = shape.kv_bytes_per_token(wb) * seq // sec.tensor_parallel_size
    if kv < per_seq:
        raise ConfigError(
            f"{knob}: {role}'s vLLM engine gets {gib(budget)} GiB per GPU, which leaves "
            f"{gib(kv)} GiB for the KV cache after the weights ({gib(weights)} GiB) and vLLM's "
            f"working memory ({gib(VLLM_WORKING_BYTES)} GiB); one sequence of {seq} tokens "
            f"({role}.max_model_len, or the model's context) needs {gib(per_seq)} GiB")
    staging = receiver_staging(cfg, shape, vllm=True)
    awake = _awake_always(cfg, role)
    asleep = budget if awake else 0
    parts = {"weights": weights, "working": VLLM_WORKING_BYTES, "kv_cache": kv,
             "reserved": budget, "sync_staging": staging}
    phases = {"generate": budget, "score": asleep, "learn": asleep,
              "sync": (budget if awake else weights) + staging}
    return RoleMemory(role, getattr(cfg.cluster, role).num_gpus, parts, phases, knob,
                      start_extra=max(0, start - budget))


def hf_role(cfg: RunConfig, shape: Shape, role: str, sequences: int) -> RoleMemory:
    """An HF engine on a GPU: weights + the KV cache of `sequences` at the model's context
    and one step's float32 logits (torch keeps the blocks cached between stages)."""
    wb = DTYPE_BYTES[cfg.model.dtype]
    seq = shape.context
    weights = shape.params() * wb
    kv = sequences * seq * shape.kv_bytes_per_token(wb)
    logits = sequences * shape.vocab * 4
    total = weights + kv + logits
    res = cfg.cluster.eval if role == "eval" else getattr(cfg.cluster, role)
    parts = {"weights": weights, "kv_cache": kv, "logits": logits}
    staging = 0 if role == "eval" else receiver_staging(cfg, shape, vllm=False)
    if staging:
        parts["sync_staging"] = staging
    return RoleMemory(role, res.num_gpus, parts,
                      {**dict.fromkeys(PHASES, total), "sync": total + staging},
                      f"cluster.{role}.num_gpus")


def learner_role(cfg: RunConfig, shape: Shape, rank: int) -> RoleMemory:
    """One learner rank: ZeRO-sharded weights, gradients and AdamW state, activations of one
    micro-batch, KL reference, weight publish staging."""
    lc = cfg.learner
    wb = DTYPE_BYTES[cfg.model.dtype]
    p, t = shape.params(), _trainable(shape, lc.trainable)
    ds = lc.backend == "deepspeed"
    n = lc.num_ranks
    shard = {s: (n if ds and lc.zero_stage >= s else 1) for s in (1, 2, 3)}
    weights = 0 if lc.offload_params else p * wb // shard[3]
    live = min(p, ZERO3_LIVE_PARAMS) * wb if ds and lc.zero_stage == 3 else 0
    buckets = min(t, DS_BUCKET_ELEMENTS) * wb if ds else 0  # gradient reduce bucket
    grads = t * wb // shard[2]
    per_param = 12 if ds and wb < 4 else 2 * wb  # fp32 master + 2 moments | 2 moments
    optimizer = 0 if lc.offload_optimizer else t * per_param // shard[1]
    kl_ref = p * wb if lc.kl_coef > 0 else 0
    seq = max(sequence_tokens(cfg, shape, r) for r in ("proposer", "solver"))
    act = lc.micro_batch * seq * shape.activation_bytes_per_token(wb, lc.gradient_checkpointing)
    # nccl: a bucket and the device copies it is concatenated from; ipc: the live parameters
    # are shared (`LearnerWorker.publish_ipc`), except ZeRO-3's gathered copy
    ipc_copy = p * wb if ds and lc.zero_stage == 3 else 0
    staging = {"nccl": 2 * bucket_bytes(cfg, shape), "ipc": ipc_copy}.get(lc.weight_sync, 0)
    resident = weights + optimizer + kl_ref + (grads if ds else 0)
    parts = {"weights": weights, "grads": grads, "optimizer": optimizer, "zero3_live": live,
             "reduce_bucket": buckets, "kl_reference": kl_ref, "activations": act,
             "sync_staging": staging}
    phases = {"generate": resident, "score": resident,
              "learn": weights + grads + optimizer + kl_ref + live + buckets + act,
              "sync": resident + live + staging}
    if act >= max(optimizer, weights + grads):
        knob = "learner.micro_batch"
    elif optimizer >= weights + grads:
        knob = "learner.offload_optimizer"
    else:
        knob = "learner.zero_stage" if lc.zero_stage < 3 else "learner.num_ranks"
    return RoleMemory(f"learner-{rank}" if n > 1 else "learner", cfg.cluster.learner.num_gpus,
                      parts, phases, knob)


def scorer_role(cfg: RunConfig, shape: Shape, index: int) -> RoleMemory:
    """One scorer: weights, then for gradient rewards the float32 reference gradient of its
    share (precond_cosine: also the metric M and M g_ref), for SOAR (reward.kind=soar) the trained copy, its gradients and inner optimizer
    state (AdamW: 2 moments in scorer.dtype); plus one pass's activations. Other rewards
    (difficulty, novelty) run no pass: weights only."""
    sc = cfg.scorer
    wb = DTYPE_BYTES[sc.dtype]
    p = shape.params()
    weights = p * wb
    solver_seq = sequence_tokens(cfg, shape, "solver")
    tokens = max(sc.max_batch_tokens, solver_seq)
    act = tokens * shape.activation_bytes_per_token(wb, checkpointing=False)
    staging = receiver_staging(cfg, shape, vllm=False)
    knob = "scorer.max_batch_tokens" if sc.max_batch_tokens >= solver_seq \
        else "solver.max_model_len"
    needs = cfg.reward.needs  # config.reward_kinds: what the scorer's pass holds
    if needs.scorer_pass == "heldout_loss":
        moments = 2 * p * wb if cfg.reward.soar_optimizer == "adamw" else 0
        parts = {"weights": weights, "soar_copy": weights, "soar_grads": weights,
                 "soar_optimizer": moments, "activations": act, "sync_staging": staging}
        if moments > act:
            knob = "reward.soar_optimizer"
    elif needs.scorer_pass == "none":  # difficulty, novelty: no model passes
        parts = {"weights": weights, "sync_staging": staging}
    else:
        share = _trainable(shape, sc.params)
        if sc.shard_mode == "param_shard":
            share = -(-share // sc.num_scorers)
        parts = {"weights": weights, "reference_grad": 4 * share, "activations": act,
                 "chunks": SCORER_CHUNK_BYTES, "sync_staging": staging}
        if needs.metric:  # precond_cosine: float32 M and M g_ref of the share
            parts["metric"] = 8 * share
    total = sum(v for k, v in parts.items() if k != "sync_staging")
    phases = {**dict.fromkeys(PHASES, total), "sync": total + staging}
    return RoleMemory(f"scorer-{index}", cfg.cluster.scorer.num_gpus, parts, phases, knob)


def gpu_roles(cfg: RunConfig, shape: Shape, gpu_bytes: int) -> list[RoleMemory]:
    """Every actor that asks for a GPU, in placement order (learner, scorers, generators,
    eval)."""
    c = cfg.cluster
    out: list[RoleMemory] = []
    if c.learner.num_gpus > 0:
        out += [learner_role(cfg, shape, r) for r in range(cfg.learner.num_ranks)]
    if c.scorer.num_gpus > 0:
        out += [scorer_role(cfg, shape, i) for i in range(cfg.scorer.num_scorers)]
    types = len(cfg.task.types)
    sequences = {"proposer": cfg.proposer.batch_size * types,
                 "solver": cfg.solver.n_samples * (cfg.proposer.batch_size * types
                                                   + cfg.solver.seed_tasks_per_step)}
    for role in ("proposer", "solver"):
        if getattr(c, role).num_gpus <= 0:
            continue
        if getattr(cfg, role).engine == "vllm":
            out.append(vllm_role(cfg, shape, role, gpu_bytes))
        else:
            out.append(hf_role(cfg, shape, role, sequences[role]))
    if cfg.eval.every_steps and c.eval.num_gpus > 0:
        out.append(hf_role(cfg, shape, "eval", cfg.eval.batch_size))
    return out
