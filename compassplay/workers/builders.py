"""Factories that turn config sections into core objects (shared by both executors).

Each actor of the Ray pipeline calls exactly one of these; the local executor calls them all.
"""

from __future__ import annotations

import copy
import fnmatch
import logging

import torch

from compassplay.config import (
    ConfigError,
    RunConfig,
    SamplingSection,
)
from compassplay.engines.factory import make_generation_engine
from compassplay.engines.generation.base import GenerationEngine
from compassplay.engines.generation.hf import HFGenerationEngine
from compassplay.envs.code import CodeEnvironment, CodeRunner
from compassplay.envs.interface import Environment
from compassplay.envs.lean import LeanEnvironment
from compassplay.rewards.batch import Example
from compassplay.rewards.frozen_prefix import lowest_layer_of
from compassplay.rewards.reference_set import load_reference
from compassplay.rewards.subspace import last_blocks_globs
from compassplay.step.prompting import reference_examples
from compassplay.verifiers.lean.repl_pool import LeanPool
from compassplay.verifiers.sandbox.pool import PythonSandbox

log = logging.getLogger(__name__)


def configure_process(cfg: RunConfig) -> None:
    """Apply `run.torch_threads` (0 keeps torch's default, or Ray's per-actor OMP setting) and
    `logging.level` to this process. An actor's process has no logging handler of its own, so
    its INFO lines (the decode dtype chosen, a model built) would be dropped; given one, they
    reach the driver's console through Ray's log forwarding."""
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(cfg.logging.level)
    if cfg.run.torch_threads:
        torch.set_num_threads(cfg.run.torch_threads)


def role_gpus(cfg: RunConfig, role: str) -> float:
    """GPUs the role's worker runs on (its `cluster.<role>.num_gpus`; 0 without CUDA), for
    device-second accounting (`step.timing.timed`)."""
    return getattr(cfg.cluster, role).num_gpus if torch.cuda.is_available() else 0.0


def role_device(cfg: RunConfig, role: str) -> torch.device:
    """Where the role's model lives: `cuda` (the first GPU Ray made visible to the actor) when
    `cluster.<role>.num_gpus > 0` and CUDA is available, else `cpu`. Ray sets
    CUDA_VISIBLE_DEVICES per actor, so device index 0 is the actor's own GPU."""
    return torch.device("cuda" if role_gpus(cfg, role) > 0 else "cpu")


def make_verifier_backend(cfg: RunConfig) -> PythonSandbox | LeanPool:
    """What the verifier worker holds, by `task.domain`: a started Python sandbox pool (code)
    or a started Lean REPL pool (lean, `verifiers.lean`); the caller closes it."""
    if cfg.task.domain == "lean":
        return LeanPool.from_config(cfg.verifiers.lean).start()
    return PythonSandbox.from_config(cfg.verifiers).start()


def make_env(cfg: RunConfig, backend: CodeRunner | LeanPool | None) -> Environment:
    """The environment of `task.domain`; `backend` (sandbox runner or LeanPool) may be None
    where nothing is executed or checked (prompting only)."""
    if cfg.task.domain == "lean":
        return LeanEnvironment(cfg, backend)
    r = cfg.reward
    heldout = r.soar_heldout_items if r.needs.heldout_loss and r.soar_heldout == "seeds" else 0
    return CodeEnvironment(cfg.task, backend, seed=cfg.run.seed,
                           num_references=cfg.proposer.num_references, heldout=heldout)


def param_globs(spec: str, model: torch.nn.Module) -> list[str] | None:
    """'all' -> None (every parameter); 'last:K' -> the last K transformer blocks and the
    final norm; 'glob1,glob2' -> those `named_parameters()` globs."""
    spec = spec.strip()
    if spec == "all":
        return None
    if spec.startswith("last:"):
        globs = last_blocks_globs(model, int(spec.split(":", 1)[1]))
        prefix = globs[0].rsplit(".", 3)[0]  # e.g. "model" of "model.layers.29.*"
        return globs + [f"{prefix}.norm.*"]
    return [g.strip() for g in spec.split(",") if g.strip()]


def scorer_params(spec: str, model: torch.nn.Module):
    """'all' | 'last:K' | 'glob1,glob2' | 'proj:DIM' (seeded random projection) ->
    GradientScorer params."""
    spec = spec.strip()
    if spec.startswith("proj:"):
        return {"kind": "projection", "dim": int(spec.split(":", 1)[1]), "seed": 0}
    return param_globs(spec, model) or "all"


def freeze_except(model: torch.nn.Module, spec: str, field: str) -> int:
    """Leave only the parameters of `spec` (see `param_globs`) trainable; returns how many
    parameters stay trainable. A spec that matches nothing is a ConfigError naming `field`."""
    globs = param_globs(spec, model)
    if globs is None:
        return sum(p.numel() for p in model.parameters() if p.requires_grad)
    keep = 0
    for name, p in model.named_parameters():
        p.requires_grad_(any(fnmatch.fnmatchcase(name, g) for g in globs))
        keep += p.numel() if p.requires_grad else 0
    if not keep:
        raise ConfigError(f"{field}={spec!r}: no parameter of the model matches {globs}")
    return keep


def vllm_options(cfg: RunConfig, section: SamplingSection) -> dict:
    """The `VLLMGenerationEngine` keyword arguments a role's config asks for."""
    role = "proposer" if section is cfg.proposer else "solver"
    opts = {"dtype": cfg.model.dtype, "seed": cfg.run.seed,
            "gpu_memory_utilization": section.gpu_memory_utilization,
            "tensor_parallel_size": section.tensor_parallel_size,
            "enable_sleep_mode": section.enable_sleep_mode,
            "sleep_level": section.sleep_level, "role": role,
            "bucket_bytes": cfg.learner.sync_bucket_mb << 20}
    if section.enforce_eager:
        opts["enforce_eager"] = True
    if section.kv_cache_mb:
        opts["kv_cache_bytes"] = section.kv_cache_mb << 20
    if section.max_model_len:
        opts["max_model_len"] = section.max_model_len
    return opts


def vllm_model_path(cfg: RunConfig) -> str:
    """What vLLM loads itself: a local HF dir, a hub id, or SmolLM2 converted by the model
    cache (model.source=smollm2-gguf)."""
    if cfg.model.source == "smollm2-gguf":
        from compassplay.models.loading import (  # lazy: pulls transformers
            model_cache_dir,
            prepare_smollm2,
        )

        return str(prepare_smollm2(model_cache_dir(cfg.model)))
    if cfg.model.source not in ("local", "hub"):
        raise ConfigError("proposer/solver.engine=vllm needs model.source=local, hub or "
                          "smollm2-gguf (vLLM loads the weights itself)")
    if cfg.model.source == "local":
        from compassplay.models.loading import resolve_local  # lazy: pulls transformers

        return str(resolve_local(cfg.model.name_or_path))
    return cfg.model.name_or_path


def load_tokenizer(cfg: RunConfig):
    """Only the tokenizer of `model.name_or_path` (a vLLM role needs no HF model copy)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(vllm_model_path(cfg),
                                         local_files_only=cfg.model.source == "local")


def frozen_states_layer(cfg: RunConfig, model: torch.nn.Module | None) -> int | None:
    """The block whose input states a generator keeps for the learner (`learner.
    frozen_states`): the lowest one `learner.trainable` trains, where that is above block 0
    and the learner can take them (the torch backend, one rank); else None."""
    lc = cfg.learner
    if model is None or lc.frozen_states != "auto" or lc.backend != "torch" or \
            lc.num_ranks != 1:
        return None
    globs = param_globs(lc.trainable, model)
    if globs is None:
        return None
    chosen = [p for n, p in model.named_parameters()
              if any(fnmatch.fnmatchcase(n, g) for g in globs)]
    k = lowest_layer_of(model, chosen)
    layers = getattr(getattr(model, "model", None), "layers", None)
    return k if layers is not None and 0 < k < len(layers) else None


def make_generator(cfg: RunConfig, section: SamplingSection, model: torch.nn.Module | None,
                   tokenizer, device: torch.device | str = "cpu",
                   capture_layer: int | None = None) -> GenerationEngine:
    """The role's generation engine: HF on its own copy of `model` on `device` (keeping the
    states entering block `capture_layer`, `frozen_states_layer`), or vLLM
    (GPU), which loads `model.name_or_path` itself (`model` unused, may be None) with the
    dtype, seed, context length, tensor parallelism and sleep mode of the config, and then
    receives weights in place by version."""
    if section.engine == "vllm":
        return make_generation_engine("vllm", vllm_model_path(cfg), tokenizer,
                                      **vllm_options(cfg, section))
    if model is None:
        raise ValueError("engine 'hf' needs the model")
    return HFGenerationEngine(copy.deepcopy(model).to(device), tokenizer,
                              decode_dtype=section.decode_dtype,
                              decode_kernels=section.decode_kernels,
                              capture_layer=capture_layer)


def make_reference(cfg: RunConfig, tokenizer) -> list[Example]:
    items = load_reference(cfg.reference.path, cfg.reference.max_items)
    return reference_examples(tokenizer, items)
