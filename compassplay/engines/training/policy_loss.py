"""Clipped PPO surrogate with token-mean reduction and an optional k3 KL penalty (pure).

All tensors are [B, T] aligned on completion tokens; `mask` is 1 on tokens that count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LossTerms:
    """The scalar loss to backpropagate and detached sums for logging (over masked tokens)."""

    loss: torch.Tensor
    clipped_tokens: float
    kl_sum: float
    n_tokens: float


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy || ref): exp(r) - r - 1 with r = ref - logp; >= 0."""
    r = ref_logp - logp
    return torch.exp(r) - r - 1.0


def ppo_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
             clip_eps: float, ref_logp: torch.Tensor | None = None, kl_coef: float = 0.0,
             normalizer: float | None = None) -> LossTerms:
    """Token-mean of ``-min(ratio*A, clip(ratio, 1-eps, 1+eps)*A) + kl_coef * k3``.

    ratio = exp(logp - old_logp) (log-probs in nats). The sum over masked tokens is divided by
    `normalizer` (default: this batch's masked token count); pass the token count of the whole
    batch when accumulating micro-batches so the summed gradient equals the full-batch one.
    """
    mask = mask.to(logp.dtype)
    n_tok = float(mask.sum().item())
    denom = normalizer if normalizer is not None else max(n_tok, 1.0)
    ratio = torch.exp(logp - old_logp)
    surr = torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv)
    per_tok = -surr
    kl_sum = 0.0
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp)
        kl_sum = float((kl.detach() * mask).sum().item())
        if kl_coef:
            per_tok = per_tok + kl_coef * kl
    loss = (per_tok * mask).sum() / denom
    clipped = ((ratio.detach() - 1.0).abs() > clip_eps).to(mask.dtype)
    return LossTerms(loss=loss, clipped_tokens=float((clipped * mask).sum().item()),
                     kl_sum=kl_sum, n_tokens=n_tok)
