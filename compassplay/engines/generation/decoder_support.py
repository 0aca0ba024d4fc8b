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


FLOAT32_PACKS = ("mkl", "onednn")


def pack_kind(dtype: torch.dtype, float32: str = "mkl") -> str | None:
    """How a decode step's CPU matmuls in `dtype` use weights packed for their row count:
    "mkl" (`torch.ops.mkl._mkl_linear`: the same sums as `F.linear`) or "onednn"
    (`torch.ops.mkldnn._linear_pointwise`), or None (unpacked `F.linear`).

    bfloat16: oneDNN (2-3x faster than `F.linear` at 16 rows on Zen 4, whose bfloat16
    `F.linear` reorders the weight on every call; the same sums), only on CPUs with AVX512
    (BW, VL, DQ) or AVX-NE-CONVERT (`onednn_bf16_supported`); an AVX2-only CPU gets None.
    float32: `float32` ("mkl" or "onednn", where available; `dtype_choice` measures which is
    faster on this machine: MKL's small-row sgemm ran at a third of oneDNN's speed on an
    AVX2 Zen 3)."""
    if float32 not in FLOAT32_PACKS:
        raise ValueError(f"float32 packing {float32!r}: expected one of {FLOAT32_PACKS}")
    if dtype == torch.float32:
        if float32 == "onednn" and onednn_available():
            return "onednn"
        return "mkl" if torch.backends.mkl.is_available() else None
    if dtype == torch.bfloat16 and onednn_bf16_supported():
        return "onednn"
    return None


def onednn_available() -> bool:
    """Whether torch has oneDNN's packed linear (`_reorder_linear_weight`,
    `_linear_pointwise`) on this CPU."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn,
                                                              "_linear_pointwise")


def onednn_bf16_supported() -> bool:
    """Whether oneDNN runs bfloat16 on this CPU (its own check: AVX512 BW/VL/DQ or
    AVX-NE-CONVERT); without it `torch.ops.mkldnn._reorder_linear_weight` raises on bfloat16."""
    if not onednn_available():
        return False
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check()) if check is not None else False
