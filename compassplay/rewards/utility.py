"""Realized utility of a candidate: how much one step on its verified solution lowers a
target loss, measured from the same weights for every candidate.

Three steps along a candidate's loss gradient g (`loss_gradient`), each an update `delta`
(a list of tensors, theta <- theta + delta) that `step_drops` applies, evaluates and undoes:
* `sgd_delta`: -eta g, the paper's plain gradient step (first order: drop = eta <g, g_t>);
* `direction_delta`: -length g / ||g||, the direction the cosine scores at a fixed length
  (first order: drop = length ||g_t|| cos(g, g_t));
* `adamw_delta`: one step of the learner's AdamW with a given moment state (a run's
  checkpoint, `optimizer.pt`), or a fresh state (its first step is about lr sign(g)).
`predicted_drop` is the first-order prediction -<delta, g_t> of each.

The paper's first-order claim: after a plain gradient step of size eta on candidate x,
L_t(theta - eta g(x)) ~ L_t(theta) - eta <g(x), g_t>, so for small eta the realized drop
tracks eta <g, g_t>, and at a fixed step length the cosine ranks candidates by how much their
step teaches.

Losses are mean token cross-entropies in nats (mean over examples of each one's mean token loss,
as `rewards.soar.mean_loss`). Every measurement restores the weights it started from.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from compassplay.rewards.batch import Example, batch_losses, make_batch, plan_batches

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


def loss_gradient(model: nn.Module, examples: list[Example], pad_id: int = 0,
                  max_batch_tokens: int = 2048) -> list[torch.Tensor]:
    """The gradient of the mean loss of `examples` at the current weights, one detached tensor
    per trainable parameter in `model.parameters()` order: g(x) of one candidate, or g_ref of
    the reference set. Accumulated over micro-batches of at most `max_batch_tokens` padded
    tokens (a 24-solution set in one batch holds GBs of vocabulary logits)."""
    params = _trainable(model)
    for p in params:
        p.grad = None
    dev = next(model.parameters()).device
    for index in plan_batches(examples, max_batch_tokens):
        batch = make_batch([examples[i] for i in index], index, dev, pad_id)
        (batch_losses(model, batch).sum() / len(examples)).backward()
    out = [p.grad.detach().clone() for p in params]
    for p in params:
        p.grad = None
    return out


def sgd_delta(grad: list[torch.Tensor], eta: float) -> list[torch.Tensor]:
    """-eta g: a plain gradient step of size eta."""
    return [-eta * g for g in grad]


def grad_norm(grad: list[torch.Tensor]) -> float:
    """||g|| over all tensors (float64 sum)."""
    return math.sqrt(sum(float(g.double().pow(2).sum()) for g in grad))


def direction_delta(grad: list[torch.Tensor], length: float) -> list[torch.Tensor]:
    """-length g / ||g||: the gradient's direction at a fixed step length (zeros for g = 0)."""
    norm = grad_norm(grad)
    return [torch.zeros_like(g) if norm == 0 else (-length / norm) * g for g in grad]


def learner_adamw(params: list[nn.Parameter], lr: float,
                  state: dict | None = None) -> torch.optim.AdamW:
    """The learner's AdamW over `params` (betas 0.9, 0.999, eps 1e-8, no weight decay, as
    `engines.training.torch_learner.make_adamw`); with `state` (an AdamW `state_dict()` of the same
    parameters: a run's `learner/optimizer.pt`) it continues that state's moments, step count
    and learning rate (from a copy: `state` is left as it is)."""
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    if state is not None:
        opt.load_state_dict(copy.deepcopy(state))
    return opt


def adamw_delta(model: nn.Module, grad: list[torch.Tensor], state: dict | None, *, lr: float,
                max_grad_norm: float) -> list[torch.Tensor]:
    """The update one step of the learner's optimizer (`learner_adamw`) makes along `grad` over
    the trainable parameters, the gradient clipped to `max_grad_norm` first, as the learner
    clips. `state`: the optimizer state to continue (its learning rate is used, `lr` is then
    ignored), or None for a fresh one. The weights are left as they were."""
    with restored(model):
        params = _trainable(model)
        start = [p.detach().clone() for p in params]
        for p, g in zip(params, grad, strict=True):
            p.grad = g.clone()
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        learner_adamw(params, lr, state).step()
        return [p.detach() - s for p, s in zip(params, start, strict=True)]


def step_drops(model: nn.Module, delta: list[torch.Tensor], losses: dict[str, LossFn],
               before: dict[str, float]) -> dict[str, float]:
    """Per target loss, the drop (before minus after, nats/token) after theta <- theta + delta
    on the trainable parameters; `before` holds each loss at the starting weights. The weights
    are put back."""
    with restored(model):
        with torch.no_grad():
            for p, d in zip(_trainable(model), delta, strict=True):
                p.add_(d)
        return {k: before[k] - fn(model) for k, fn in losses.items()}


def predicted_drop(delta: list[torch.Tensor], target_grad: list[torch.Tensor]) -> float:
    """The first-order drop of a loss with gradient `target_grad` after `delta`: -<delta, g_t>."""
    return -sum(float((d.double() * g.double()).sum())
                for d, g in zip(delta, target_grad, strict=True))
