"""logging.reference_loss: the batched, no-grad reference loss equals the per-example oracle."""

from __future__ import annotations

import pytest
import torch

from compassplay.rewards.batch import Example, example_loss, mean_example_loss
from tests.rewards.conftest import tiny_model

EXAMPLES = [Example([1, 2, 3], [4, 5]), Example([6, 7], [8, 9, 10, 11]),
            Example([20, 21, 22, 23, 24], [25]), Example([30], [31, 32])]


@pytest.mark.parametrize("max_batch_tokens", [1, 8, 4096])
def test_mean_example_loss_matches_the_unpadded_oracle(max_batch_tokens):
    model = tiny_model("llama", tied=True)
    model.train()  # the helper must score in eval mode and restore the flag
    with torch.no_grad():
        model.eval()
        oracle = torch.stack([example_loss(model, e) for e in EXAMPLES]).mean().item()
        model.train()
    got = mean_example_loss(model, EXAMPLES, max_batch_tokens=max_batch_tokens)
    assert got == pytest.approx(oracle, rel=1e-6)
    assert model.training and all(p.grad is None for p in model.parameters())
    assert mean_example_loss(model, []) == 0.0
