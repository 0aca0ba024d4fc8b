"""Factories the pipeline calls: `make_learner` and `make_generation_engine`."""

from __future__ import annotations

import copy
from typing import Any

import torch

from compassplay.engines.generation.base import GenerationEngine
from compassplay.engines.generation.hf import HFGenerationEngine
from compassplay.engines.generation.vllm import VLLMGenerationEngine
from compassplay.engines.training.dist import RankInfo
from compassplay.engines.training.learner import PolicyLearner
from compassplay.engines.training.slot import Slot


def make_learner(cfg, model: torch.nn.Module, ref_model: torch.nn.Module | None = None, *,
                 proposer_model: torch.nn.Module | None = None,
                 total_steps: int | None = None, dist: RankInfo | None = None) -> PolicyLearner:
    """A learner for `cfg` (a `LearnerSection`).

    cfg.shared_model: `model` plays both roles (slot "policy"); otherwise `model` is the solver
    and `proposer_model` (default: a deep copy of `model`) the proposer. `ref_model` is the
    frozen reference for the KL term (required when cfg.kl_coef > 0). `total_steps` (number of
    learner steps in the run) is needed by the cosine/linear schedules. `dist`: this rank of
    a learner group (deepspeed; None = a world of 1), every rank calls make_learner together.
    """
    if dist is not None and dist.world_size > 1 and cfg.backend != "deepspeed":
        raise ValueError(f"a learner group of {dist.world_size} ranks needs "
                         f"learner.backend=deepspeed (got {cfg.backend!r})")
    models: dict[str, torch.nn.Module] = {"policy": model} if cfg.shared_model else {
        "solver": model,
        "proposer": proposer_model if proposer_model is not None else copy.deepcopy(model)}
    if cfg.gradient_checkpointing:
        for m in models.values():
            enable_gradient_checkpointing(m)
    if cfg.backend == "torch":
        from compassplay.engines.training.torch_learner import TorchSlot  # lazy: pulls safetensors

        slots: dict[str, Slot] = {k: TorchSlot(m, cfg, total_steps) for k, m in models.items()}
    elif cfg.backend == "deepspeed":
        from compassplay.engines.training.deepspeed import DeepSpeedSlot  # lazy: pulls safetensors

        slots = {k: DeepSpeedSlot(m, cfg, total_steps, dist) for k, m in models.items()}
    else:
        raise ValueError(f"learner.backend: unknown backend {cfg.backend!r} "
                         "(expected 'torch' or 'deepspeed')")
    return PolicyLearner(slots, cfg, ref_model=ref_model, backend=cfg.backend)


def make_generation_engine(kind: str, model: Any, tokenizer: Any = None,
                           **kwargs: Any) -> GenerationEngine:
    """kind "hf": `model` is a transformers module; kind "vllm": `model` is an HF directory or
    hub id that vLLM loads itself (GPU only; extra kwargs go to `VLLMGenerationEngine`)."""
    if kind == "hf":
        if tokenizer is None:
            raise ValueError("engine 'hf' needs a tokenizer")
        return HFGenerationEngine(model, tokenizer, **kwargs)
    if kind == "vllm":
        return VLLMGenerationEngine(model, tokenizer=tokenizer, **kwargs)
    raise ValueError(f"engine: unknown generation engine {kind!r} (expected 'hf' or 'vllm')")


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """`learner.gradient_checkpointing`: each transformer block keeps only its input for the
    backward pass and recomputes the rest (transformers' non-reentrant checkpointing). Under
    ZeRO-3 with frozen parameters (learner.trainable) it needs DeepSpeed >= 0.19.3: older
    releases fail in backward with a CheckpointError (deepspeed PR #8148;
    `deepspeed_learner.check_deepspeed_version`). Needs a transformers model
    (`gradient_checkpointing_enable`)."""
    enable = getattr(model, "gradient_checkpointing_enable", None)
    if enable is None:
        raise ValueError(f"learner.gradient_checkpointing=true: {type(model).__name__} has no "
                         "gradient_checkpointing_enable (not a transformers model)")
    enable(gradient_checkpointing_kwargs={"use_reentrant": False})

