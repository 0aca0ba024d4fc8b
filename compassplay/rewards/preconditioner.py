"""The metric of the learner's optimizer: AdamW's diagonal preconditioner.

AdamW's next step along a gradient g is about -lr * g / (sqrt(v_hat) + eps), with v_hat the
bias-corrected second-moment estimate the learner holds (element by element, the candidate's own
g^2 left out). To first order the drop of a loss L_t after that step is
lr * <g_t, M g> with M = diag(1 / (sqrt(v_hat) + eps)), so the cosine that ranks tasks by that
step's direction is the cosine in the metric M:

    cos_M(g, g_ref) = <g, M g_ref> / sqrt(<g, M g> <g_ref, M g_ref>).

`adamw_metric` builds M from an optimizer state; `metric_cosine` is the plain-tensor definition
(the oracle the batched scorer is checked against).
"""

from __future__ import annotations

import math

import torch


def adamw_metric(exp_avg_sq: torch.Tensor, step: int, beta2: float = 0.999,
                 eps: float = 1e-8) -> torch.Tensor:
    """M = 1 / (sqrt(v / (1 - beta2^step)) + eps), float32, the shape of `exp_avg_sq` (AdamW's
    `state["exp_avg_sq"]` after `step` steps; units 1/|gradient|). step 0 (no state yet):
    ones (the plain metric)."""
    if step <= 0:
        return torch.ones_like(exp_avg_sq, dtype=torch.float32)
    v_hat = exp_avg_sq.float() / (1.0 - beta2 ** int(step))
    return 1.0 / (v_hat.sqrt() + eps)


def metric_inner(a: list[torch.Tensor], b: list[torch.Tensor],
                 metric: list[torch.Tensor] | None) -> float:
    """<a, M b> summed over parameters in float64 (M None: the plain inner product)."""
    total = 0.0
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        prod = x.double() * y.double()
        if metric is not None:
            prod = prod * metric[i].double()
        total += float(prod.sum())
    return total


def metric_cosine(a: list[torch.Tensor], b: list[torch.Tensor],
                  metric: list[torch.Tensor] | None) -> float:
    """cos_M(a, b) over parameter lists (0.0 when either side is zero)."""
    ab, aa, bb = metric_inner(a, b, metric), metric_inner(a, a, metric), \
        metric_inner(b, b, metric)
    return ab / math.sqrt(aa * bb) if aa > 0 and bb > 0 else 0.0
