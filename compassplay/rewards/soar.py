"""SOAR-style measured utility: train a copy of the solver on a group, measure the gain.

`soar_gains` is the baseline as the paper describes it (reward.kind=soar): for each group of
candidates, a deep copy of the solver is trained for a few optimizer steps on the group's
verified solutions (a candidate given as several examples -- all its verified solutions --
contributes the mean of their losses, as its g(x) does), evaluated on held-out problems (disjoint from the reference set; by default
the held-out loss of their gold answers, or greedy accuracy with `metric="accuracy"`) and
discarded; every candidate of the group is rewarded with the gain, and the call reports the
tokens and seconds it spent.

`measured_utility` (below, kept for comparison) is the older in-place variant: one SGD step and
the drop of the *reference* loss, which to first order is lr * <g, g_ref> again.

For each group of candidates: from the current weights theta, take `inner_steps` SGD steps of
size `lr` on the group's mean candidate loss, and measure the drop of the held-out reference
loss, L_ref(theta) - L_ref(theta'). Every candidate of the group gets that value, so a batch
yields only as many distinct rewards as it has groups (the paper's point about SOAR). The
model's weights and .grad fields are restored exactly afterwards.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from .batch import (
    CandidateExamples,
    Example,
    batch_losses,
    make_batch,
    plan_batches,
    scoring_mode,
    solution_sets,
)


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


def make_groups(n: int, num_groups: int, group_size: int = 0) -> list[list[int]]:
    """Candidate groups: contiguous chunks of `group_size` (the last may be smaller) when
    `group_size > 0`, else `split_groups(n, num_groups)`. Empty groups are dropped."""
    if group_size > 0:
        return [list(range(s, min(n, s + group_size))) for s in range(0, n, group_size)]
    return [g for g in split_groups(n, num_groups) if g]


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


# ------------------------------------------------------------------------------------------
# SOAR as the paper describes it: train a real copy on each group, evaluate it on held-out
# problems (never the reference set), reward the group with the gain.
# ------------------------------------------------------------------------------------------

SoarMetric = Literal["loss", "accuracy"]
SoarOptimizer = Literal["sgd", "adamw"]


@dataclass(frozen=True)
class HeldOutItem:
    """One held-out problem: `example` (prompt ids -> gold answer ids) defines its loss;
    `grade(completion_ids) -> bool` (optional) grades a greedy completion for accuracy."""

    example: Example
    grade: Callable[[list[int]], bool] | None = None


@dataclass
class SoarResult:
    """Per-group gains and what they cost.

    `gains[k]`: metric "loss": the held-out loss drop `L(theta) - L(theta_k)` (nats, > 0 =
    helpful); metric "accuracy": `acc(theta_k) - acc(theta)` (fraction of held-out problems).
    `train_tokens`: tokens (prompt + target, unpadded) of every inner forward/backward, summed
    over groups and inner steps; `eval_tokens`: tokens of the held-out evaluations (teacher
    forced for loss, prompt + generated for accuracy); `seconds`: wall time of the whole call.
    """

    gains: list[float]
    before: float
    after: list[float]
    train_tokens: int = 0
    eval_tokens: int = 0
    seconds: float = 0.0


def check_disjoint(reference: list[Example], heldout: list[Example]) -> None:
    """Raise ValueError when a held-out problem is also a reference problem (same prompt)."""
    ref = {tuple(e.prompt_ids) for e in reference}
    both = [i for i, e in enumerate(heldout) if tuple(e.prompt_ids) in ref]
    if both:
        raise ValueError(f"SOAR held-out set overlaps the reference set (held-out items "
                         f"{both[:8]}): evaluate on problems the reference set does not hold")


def heldout_loss(model: nn.Module, items: list[Example], pad_id: int = 0,
                 max_batch_tokens: int = 16384) -> float:
    """Mean over held-out items of their mean token cross-entropy of the gold answer."""
    dev = next(model.parameters()).device
    total = 0.0
    with torch.no_grad():
        for idx in plan_batches(items, max_batch_tokens):
            batch = make_batch([items[i] for i in idx], idx, dev, pad_id)
            total += float(batch_losses(model, batch).double().sum())
    return total / len(items)


def greedy_ids(model: nn.Module, prompt_ids: list[int], max_new_tokens: int,
               eos_id: int | None = None) -> list[int]:
    """Greedy completion token ids of one prompt (stops after `eos_id`), no KV cache tricks."""
    dev = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids)], device=dev)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(input_ids=ids, use_cache=False).logits[0, -1]
            nxt = int(logits.argmax())
            out.append(nxt)
            if eos_id is not None and nxt == eos_id:
                break
            ids = torch.cat([ids, torch.tensor([[nxt]], device=dev)], dim=1)
    return out


def heldout_accuracy(model: nn.Module, items: list[HeldOutItem], max_new_tokens: int,
                     eos_id: int | None = None) -> tuple[float, int]:
    """Fraction of held-out items whose greedy completion `grade` accepts, and the tokens
    processed (prompt + generated)."""
    if any(it.grade is None for it in items):
        raise ValueError("soar metric 'accuracy' needs a grader for every held-out item")
    correct, tokens = 0, 0
    for it in items:
        gen = greedy_ids(model, it.example.prompt_ids, max_new_tokens, eos_id)
        tokens += len(it.example.prompt_ids) + len(gen)
        correct += bool(it.grade(gen))  # type: ignore[misc]
    return correct / len(items), tokens


def backward_mean_loss(model: nn.Module, examples: list[CandidateExamples], pad_id: int = 0,
                       max_batch_tokens: int = 16384) -> int:
    """Accumulate the gradient of the mean over candidates of their losses (an Example's own;
    several examples: the mean of theirs) in passes of at most `max_batch_tokens` padded tokens
    (`plan_batches` over all rows): each pass backpropagates its rows' weighted losses /
    len(examples), so the activations held are one pass's, not the group's. Returns the tokens
    of the rows (identical solutions of a candidate merged)."""
    dev = next(model.parameters()).device
    sets = solution_sets(examples)
    rows = [e for c in sets for e in c.examples]
    weights = [w for c in sets for w in c.weights]
    for idx in plan_batches(rows, max_batch_tokens):
        batch = make_batch([rows[i] for i in idx], idx, dev, pad_id, [weights[i] for i in idx])
        (batch_losses(model, batch).sum() / len(sets)).backward()
    return sum(len(e) for e in rows)


def train_copy(model: nn.Module, group: list[CandidateExamples], inner_steps: int, lr: float,
               optimizer: SoarOptimizer = "sgd", pad_id: int = 0,
               max_batch_tokens: int = 16384) -> tuple[nn.Module, int]:
    """A deep copy of `model` trained for `inner_steps` full-batch steps on the group's mean
    candidate loss (gradients accumulated over passes of `max_batch_tokens`), in eval mode
    (no dropout); returns it and the tokens seen. `model` itself is not touched."""
    copy_ = copy.deepcopy(model)
    params = [p for p in copy_.parameters() if p.requires_grad]
    opt: torch.optim.Optimizer = (torch.optim.SGD(params, lr=lr) if optimizer == "sgd"
                                  else torch.optim.AdamW(params, lr=lr, weight_decay=0.0))
    tokens = 0
    with scoring_mode(copy_):
        for _ in range(inner_steps):
            opt.zero_grad(set_to_none=True)
            tokens += backward_mean_loss(copy_, group, pad_id, max_batch_tokens)
            opt.step()
    del opt
    for p in params:
        p.grad = None
    return copy_, tokens


def soar_gains(model: nn.Module, groups: list[list[CandidateExamples]],
               heldout: list[HeldOutItem], *,
               metric: SoarMetric = "loss", inner_steps: int = 1, lr: float = 1e-3,
               optimizer: SoarOptimizer = "sgd", pad_id: int = 0,
               reference: list[Example] | None = None, max_new_tokens: int = 32,
               eos_id: int | None = None, max_batch_tokens: int = 16384) -> SoarResult:
    """For each group: train a copy of `model` on it (`train_copy`), evaluate the copy on the
    held-out problems, discard it; the group's gain is the change of the held-out metric.

    `reference`, when given, must not share a problem with `heldout` (`check_disjoint`)."""
    if not heldout:
        raise ValueError("SOAR needs a non-empty held-out set")
    if reference is not None:
        check_disjoint(reference, [h.example for h in heldout])
    t0 = time.perf_counter()
    examples = [h.example for h in heldout]
    flags = [(m, m.training) for m in model.modules()]
    model.eval()

    def evaluate(m: nn.Module) -> tuple[float, int]:
        if metric == "accuracy":
            return heldout_accuracy(m, heldout, max_new_tokens, eos_id)
        return (heldout_loss(m, examples, pad_id, max_batch_tokens),
                sum(len(e) for e in examples))

    try:
        before, eval_tokens = evaluate(model)
        after, train_tokens = [], 0
        for group in groups:
            trained, tok = train_copy(model, group, inner_steps, lr, optimizer, pad_id,
                                      max_batch_tokens)
            trained.eval()
            value, etok = evaluate(trained)
            del trained
            after.append(value)
            train_tokens += tok
            eval_tokens += etok
    finally:
        for m, t in flags:
            m.training = t
    gains = [(before - a) if metric == "loss" else (a - before) for a in after]
    return SoarResult(gains, before, after, train_tokens, eval_tokens,
                      time.perf_counter() - t0)
