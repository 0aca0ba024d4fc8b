"""SOAR-style measured utility: train a copy of the solver on a group, measure the gain.

For each group of candidates: from the current weights theta, take `inner_steps` SGD steps of
size `lr` on the group's mean candidate loss, and measure the drop of the held-out reference
loss, L_ref(theta) - L_ref(theta'). Every candidate of the group gets that value, so a batch
yields only as many distinct rewards as it has groups (the paper's point about SOAR). The
model's weights and .grad fields are restored exactly afterwards.
"""

from __future__ import annotations

import torch
from torch import nn

from .batch import Example, batch_losses, make_batch, scoring_mode


def mean_loss(model: nn.Module, examples: list[Example], pad_id: int = 0) -> torch.Tensor:
    """Mean over examples of their mean token cross-entropy (one padded batch)."""
    dev = next(model.parameters()).device
    batch = make_batch(examples, list(range(len(examples))), dev, pad_id)
    return batch_losses(model, batch).mean()


def split_groups(n: int, num_groups: int) -> list[list[int]]:
    """Indices 0..n-1 in `min(n, num_groups)` contiguous groups of near-equal size."""
    k = max(1, min(n, num_groups))
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [list(range(bounds[i], bounds[i + 1])) for i in range(k)]


def measured_utility(model: nn.Module, groups: list[list[Example]], reference: list[Example],
                     lr: float = 1e-3, inner_steps: int = 1, pad_id: int = 0) -> list[float]:
    """Reference-loss decrease after training a copy on each group (nats; > 0 = helpful)."""
    if not reference:
        raise ValueError("reference set is empty: measured utility needs held-out examples")
    params = [p for p in model.parameters() if p.requires_grad]
    saved = [p.detach().clone() for p in params]
    saved_grads = [None if p.grad is None else p.grad.clone() for p in params]
    out = []
    try:
        with scoring_mode(model):
            with torch.no_grad():
                before = float(mean_loss(model, reference, pad_id))
            for group in groups:
                for _ in range(inner_steps):
                    grads = torch.autograd.grad(mean_loss(model, group, pad_id), params,
                                                allow_unused=True)
                    with torch.no_grad():
                        for p, g in zip(params, grads, strict=True):
                            if g is not None:
                                p.sub_(lr * g)
                with torch.no_grad():
                    out.append(before - float(mean_loss(model, reference, pad_id)))
                    for p, s in zip(params, saved, strict=True):
                        p.copy_(s)
    finally:
        with torch.no_grad():
            for p, s, g in zip(params, saved, saved_grads, strict=True):
                p.copy_(s)
                p.grad = g
    return out
