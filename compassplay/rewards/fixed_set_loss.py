"""The mean loss of a fixed example set, evaluated again and again while only the top of the
model changes (the utility experiment: one learner step per candidate, then the held-out and
reference losses).

When the embeddings and the first k decoder layers are frozen, the hidden states entering layer
k never change: they are computed once, and every later evaluation runs only layers k.. and
the head on them (for SmolLM2-135M with `last:6`, 6 of 30 layers plus the head: about 2.7x
less work). Works on transformers' decoder-only causal LMs (`model.model.layers`); anything
else, or a check that disagrees with the plain forward, falls back to it.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from compassplay.rewards.batch import (
    Batch,
    Example,
    batch_losses,
    make_batch,
    mean_example_loss,
    plan_batches,
    scoring_mode,
)
from compassplay.rewards.frozen_prefix import layers_from, lowest_layer_of

log = logging.getLogger(__name__)


def frozen_prefix_layers(model: nn.Module) -> int:
    """How many leading decoder layers (with the embeddings) have no trainable parameter: 0
    when the embeddings train, or the model is not a transformers decoder-only LM."""
    return lowest_layer_of(model, [p for p in model.parameters() if p.requires_grad])


class FixedSetLoss:
    """`loss(model)`: mean over `examples` of their mean token cross-entropy (nats), as
    `batch.mean_example_loss`, reusing the frozen prefix's hidden states.

    Built from the weights it will see: the prefix (embeddings, layers < k) must not change
    afterwards; the top may. `prefix_layers` is k (0: every call runs the whole model)."""

    def __init__(self, model: nn.Module, examples: list[Example], pad_id: int = 0,
                 max_batch_tokens: int = 4096, check_tol: float = 1e-4) -> None:
        self.examples, self.pad_id, self.max_batch_tokens = examples, pad_id, max_batch_tokens
        self.prefix_layers = frozen_prefix_layers(model) if examples else 0
        self._cached: list[tuple[Batch, torch.Tensor]] = []
        if self.prefix_layers:
            self._cache(model)
            plain = mean_example_loss(model, examples, pad_id, max_batch_tokens)
            cached = self(model)
            if abs(cached - plain) > check_tol * max(1.0, abs(plain)):
                log.warning("cached frozen-prefix loss %.6f != plain forward %.6f: using the "
                            "plain forward", cached, plain)
                self.prefix_layers, self._cached = 0, []

    def _cache(self, model: nn.Module) -> None:
        dev = next(model.parameters()).device
        with scoring_mode(model), torch.no_grad():
            for index in plan_batches(self.examples, self.max_batch_tokens):
                batch = make_batch([self.examples[i] for i in index], index, dev, self.pad_id)
                out = model(input_ids=batch.ids, position_ids=batch.position_ids,
                            use_cache=False, output_hidden_states=True, logits_to_keep=1)
                self._cached.append((batch, out.hidden_states[self.prefix_layers].detach()))

    def __call__(self, model: nn.Module) -> float:
        if not self.prefix_layers:
            return mean_example_loss(model, self.examples, self.pad_id, self.max_batch_tokens)
        total = 0.0
        with scoring_mode(model), torch.no_grad(), layers_from(model, self.prefix_layers):
            for batch, hidden in self._cached:
                total += float(batch_losses(model, batch, inputs_embeds=hidden).sum())
        return total / len(self.examples)
