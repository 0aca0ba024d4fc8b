"""Realized utility of a candidate: how much one learner step on its verified solution lowers a
target loss, measured from the same weights for every candidate.

The paper's first-order claim: after a plain gradient step of size eta on candidate x,
L_ref(theta - eta g(x)) ~ L_ref(theta) - eta <g(x), g_ref>, so the realized drop of the
reference loss should track eta * <g, g_ref> for small eta (`first_order_drop`), and the cosine
should rank candidates by how much a step on them teaches (`optimizer_step_drops`).

Losses are mean token cross-entropies in nats (mean over examples of each one's mean token loss,
as `rewards.soar.mean_loss`). Every measurement restores the weights it started from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from compassplay.rewards.batch import Example
from compassplay.rewards.soar import mean_loss


@dataclass(frozen=True)
class StepDrops:
    """Loss drops (before minus after, nats/token; > 0 = the step helped) of one step."""

    heldout: float
    reference: float


LossFn = Callable[[nn.Module], float]
"""The loss of a fixed example set at the model's current weights (`FixedSetLoss`)."""


@contextmanager
def restored(model: nn.Module) -> Iterator[None]:
    """Run the body, then put every trainable parameter back as it was (bit for bit; the
    frozen ones are never stepped)."""
    saved = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    try:
        yield
    finally:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in saved:
                    p.copy_(saved[n])
                p.grad = None


def _trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def loss_gradient(model: nn.Module, examples: list[Example],
                  pad_id: int = 0) -> list[torch.Tensor]:
    """The gradient of the mean loss of `examples` at the current weights, one detached tensor
    per trainable parameter in `model.parameters()` order: g(x) of one candidate, or g_ref of
    the reference set."""
    params = _trainable(model)
    for p in params:
        p.grad = None
    mean_loss(model, examples, pad_id).backward()
    out = [p.grad.detach().clone() for p in params]
    for p in params:
        p.grad = None
    return out


def optimizer_step_drops(model: nn.Module, grad: list[torch.Tensor], heldout: LossFn,
                         reference: LossFn, before: StepDrops, *, lr: float,
                         max_grad_norm: float) -> StepDrops:
    """One step of the learner's optimizer (AdamW as `engines.torch_learner`, a fresh state,
    gradient clipped to `max_grad_norm`) along a candidate's gradient `grad`
    (`loss_gradient`); the drops of the held-out and reference losses from `before` (their
    values at the starting weights)."""
    with restored(model):
        params = _trainable(model)
        for p, g in zip(params, grad, strict=True):
            p.grad = g.clone()
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        opt.step()
        return StepDrops(before.heldout - heldout(model), before.reference - reference(model))


def first_order_drop(model: nn.Module, grad: list[torch.Tensor], reference: LossFn,
                     reference_before: float, g_ref: list[torch.Tensor], *,
                     eta: float) -> tuple[float, float]:
    """(realized drop of the reference loss after theta <- theta - eta g(x), and its first-order
    prediction eta * <g(x), g_ref>); `grad` and `g_ref` from `loss_gradient` at the same
    weights."""
    inner = sum(float((g.double() * r.double()).sum()) for g, r in zip(grad, g_ref, strict=True))
    with restored(model):
        with torch.no_grad():
            for p, g in zip(_trainable(model), grad, strict=True):
                p.sub_(eta * g)
        return reference_before - reference(model), eta * inner
