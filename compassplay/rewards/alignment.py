"""Alignment scores from additive partials: `AlignmentScore` (one candidate's cosine, inner
product and gradient norm), `Partials` (the additive per-candidate sums a scorer or a shard
returns) and `finalize`, which turns (reduced) partials into scores."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .functions import safe_cosine
from .reductions import rowsum

__all__ = ["AlignmentScore", "Partials", "finalize"]


@dataclass(frozen=True)
class AlignmentScore:
    """cosine: cos(g(x), g_ref) in [-1, 1] (0.0 if either gradient is zero); inner:
    <g(x), g_ref>; grad_norm: ||g(x)||; gradients of losses in nats w.r.t. the selected
    parameters, all in the projected space when the scorer projects. Under a metric M
    (`GradientScorer.set_metric`): cosine = cos_M(g, g_ref), inner = <g, M g_ref> and
    grad_norm = sqrt(<g, M g>) (M's units: 1/|gradient| for AdamW's)."""

    cosine: float
    inner: float
    grad_norm: float


@dataclass
class Partials:
    """Additive per-candidate partials (float64): inner (N,), sq (N,), proj (N, dim) or None."""

    inner: torch.Tensor
    sq: torch.Tensor
    proj: torch.Tensor | None


def finalize(p: Partials, ref_sq: float, ref_proj: torch.Tensor | None) -> list[AlignmentScore]:
    """Turn (reduced) partials into scores; in projection mode everything is in the projection."""
    if p.proj is not None and ref_proj is not None:
        rp = ref_proj.double().cpu().reshape(1, -1)
        inner, sq = rowsum(p.proj * rp), rowsum(p.proj.pow(2))
        ref_sq = float(rowsum(rp.pow(2))[0])
    else:
        inner, sq = p.inner, p.sq
    ref_norm = max(ref_sq, 0.0) ** 0.5
    out = []
    for i in range(len(inner)):
        norm = max(float(sq[i]), 0.0) ** 0.5
        out.append(AlignmentScore(cosine=safe_cosine(float(inner[i]), norm, ref_norm),
                                  inner=float(inner[i]), grad_norm=norm))
    return out
