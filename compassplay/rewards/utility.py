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

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from compassplay.rewards.batch import Example, mean_example_loss
from compassplay.rewards.soar import mean_loss


@dataclass(frozen=True)
class StepDrops:
    """Loss drops (before minus after, nats/token; > 0 = the step helped) of one step."""

    heldout: float
    reference: float


@contextmanager
def restored(model: nn.Module) -> Iterator[None]:
    """Run the body, then put every parameter back as it was (bit for bit)."""
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    try:
        yield
    finally:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(saved[n])
                p.grad = None


def _grad_step(model: nn.Module, example: Example, pad_id: int) -> list[nn.Parameter]:
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    mean_loss(model, [example], pad_id).backward()
    return params


def optimizer_step_drops(model: nn.Module, example: Example, heldout: list[Example],
                         reference: list[Example], before: StepDrops, *, lr: float,
                         max_grad_norm: float, pad_id: int = 0) -> StepDrops:
    """One step of the learner's optimizer (AdamW as `engines.torch_learner`, a fresh state,
    gradient clipped to `max_grad_norm`) on `example`'s loss; the drops of the held-out and
    reference losses from `before` (their values at the starting weights)."""
    with restored(model):
        params = _grad_step(model, example, pad_id)
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        opt.step()
        return StepDrops(before.heldout - mean_example_loss(model, heldout, pad_id),
                         before.reference - mean_example_loss(model, reference, pad_id))


def reference_gradient(model: nn.Module, reference: list[Example],
                       pad_id: int = 0) -> list[torch.Tensor]:
    """g_ref: the gradient of the reference loss at the current weights, one tensor per
    trainable parameter in `model.parameters()` order (detached copies)."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    mean_loss(model, reference, pad_id).backward()
    out = [p.grad.detach().clone() for p in params]
    for p in params:
        p.grad = None
    return out


def first_order_drop(model: nn.Module, example: Example, reference: list[Example],
                     reference_before: float, g_ref: list[torch.Tensor], *, eta: float,
                     pad_id: int = 0) -> tuple[float, float]:
    """(realized drop of the reference loss after theta <- theta - eta g(x), and its first-order
    prediction eta * <g(x), g_ref>); `g_ref` from `reference_gradient` at the same weights."""
    with restored(model):
        params = _grad_step(model, example, pad_id)
        inner = sum(float((p.grad.double() * r.double()).sum()) for p, r in zip(
            params, g_ref, strict=True))
        with torch.no_grad():
            for p in params:
                p.sub_(eta * p.grad)
        return reference_before - mean_example_loss(model, reference, pad_id), eta * inner
