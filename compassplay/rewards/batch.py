"""Padding candidates into micro-batches and the per-example loss they define.

A candidate's loss is the mean token cross-entropy (nats) of `target_ids` given `prompt_ids`
under teacher forcing, using the model's own next-token logits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Example:
    """One (prompt, verified target) pair of token ids. Both must be non-empty."""

    prompt_ids: list[int]
    target_ids: list[int]

    def __post_init__(self) -> None:
        if len(self.prompt_ids) == 0:
            raise ValueError("Example.prompt_ids must be non-empty (the first target token "
                             "needs a preceding position to be predicted from)")
        if len(self.target_ids) == 0:
            raise ValueError("Example.target_ids must be non-empty")

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.target_ids)


@dataclass
class Batch:
    """Right-padded micro-batch. Shapes: ids/position_ids/labels/weights (N, T).

    `labels[n, t]` is the token predicted at position t (-100 where no loss), `weights[n, t]` is
    `1 / len(target_n)` at target-predicting positions and 0 elsewhere, so
    `sum_t weights * ce` is the per-example mean token cross-entropy.
    """

    ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor
    weights: torch.Tensor
    index: list[int]

    @property
    def size(self) -> int:
        return int(self.ids.shape[0])


def make_batch(examples: list[Example], index: list[int], device: torch.device,
               pad_id: int = 0) -> Batch:
    """Right-pad `examples` (no attention mask is needed: causal attention never lets a real
    token see a later pad, and pads carry no loss, so their gradients are exactly zero)."""
    n, t = len(examples), max(len(e) for e in examples)
    ids = torch.full((n, t), pad_id, dtype=torch.long)
    labels = torch.full((n, t), -100, dtype=torch.long)
    weights = torch.zeros((n, t), dtype=torch.float32)
    for i, ex in enumerate(examples):
        p, m = len(ex.prompt_ids), len(ex.target_ids)
        ids[i, : p + m] = torch.tensor(list(ex.prompt_ids) + list(ex.target_ids))
        labels[i, p - 1 : p + m - 1] = torch.tensor(list(ex.target_ids))
        weights[i, p - 1 : p + m - 1] = 1.0 / m
    pos = torch.arange(t).unsqueeze(0).expand(n, t).contiguous()
    return Batch(ids.to(device), pos.to(device), labels.to(device), weights.to(device), index)


def plan_batches(examples: list[Example], max_tokens: int) -> list[list[int]]:
    """Group example indices (sorted by length) into micro-batches of at most `max_tokens`
    padded tokens (a single over-long example gets its own batch)."""
    order = sorted(range(len(examples)), key=lambda i: -len(examples[i]))
    groups: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        width = len(examples[cur[0]]) if cur else len(examples[i])
        if cur and (len(cur) + 1) * width > max_tokens:
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    return groups


def batch_losses(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Per-example mean token cross-entropy, shape (N,), float32, differentiable."""
    out = model(input_ids=batch.ids, position_ids=batch.position_ids, use_cache=False)
    logits = out.logits if hasattr(out, "logits") else out[0]
    n, t, v = logits.shape
    ce = F.cross_entropy(logits.float().reshape(n * t, v), batch.labels.reshape(n * t),
                         ignore_index=-100, reduction="none").view(n, t)
    return (ce * batch.weights).sum(1)


def mean_example_loss(model: torch.nn.Module, examples: list[Example], pad_id: int = 0,
                      max_batch_tokens: int = 4096) -> float:
    """Mean over `examples` of their mean token cross-entropy (nats), without gradient, in
    micro-batches of at most `max_batch_tokens` padded tokens (the logits of a 49k vocabulary
    make one padded batch of 32 long examples gigabytes), in eval mode. 0.0 for none."""
    if not examples:
        return 0.0
    dev = next(model.parameters()).device
    total = 0.0
    with scoring_mode(model), torch.no_grad():  # eval mode: no dropout
        for index in plan_batches(examples, max_batch_tokens):
            batch = make_batch([examples[i] for i in index], index, dev, pad_id)
            total += float(batch_losses(model, batch).sum())
    return total / len(examples)


def example_loss(model: torch.nn.Module, example: Example) -> torch.Tensor:
    """Scalar loss of one example, computed unpadded (batch of one)."""
    dev = next(model.parameters()).device
    return batch_losses(model, make_batch([example], [0], dev))[0]


@contextlib.contextmanager
def scoring_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) and grad enabled; restores every module's training flag."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.enable_grad():
            yield
    finally:
        for m, t in flags:
            m.training = t
