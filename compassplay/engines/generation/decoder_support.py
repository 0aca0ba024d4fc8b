"""Which models `StaticDecoder` runs (`unsupported_reason`) and how its CPU decode matmuls
use weights packed for their row count (`pack_kind`)."""

from __future__ import annotations

import torch

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why `StaticDecoder` cannot run `model` (None: it can)."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in SUPPORTED_MODEL_TYPES:
        return f"model_type {kind!r} is not one of {SUPPORTED_MODEL_TYPES}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} (only silu)"
    if getattr(cfg, "use_sliding_window", False):
        return "sliding-window attention"
    if getattr(cfg, "mlp_bias", False) or (kind == "llama" and getattr(cfg, "attention_bias",
                                                                       False)):
        return "biases outside q/k/v"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "rotary_emb") or not hasattr(inner, "layers"):
        return "no model.layers / model.rotary_emb"
    return None


def pack_kind(dtype: torch.dtype) -> str | None:
    """How a decode step's CPU matmuls in `dtype` use weights packed for their row count:
    "mkl" (float32, `torch.ops.mkl._mkl_linear`), "onednn" (bfloat16,
    `torch.ops.mkldnn._linear_pointwise`: 2-3x faster than `F.linear` at 16 rows on Zen 4,
    whose bfloat16 `F.linear` reorders the weight on every call; the same sums), or None
    (unpacked `F.linear`)."""
    if dtype == torch.float32 and torch.backends.mkl.is_available():
        return "mkl"
    if dtype == torch.bfloat16 and torch.backends.mkldnn.is_available() \
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return "onednn"
    return None
