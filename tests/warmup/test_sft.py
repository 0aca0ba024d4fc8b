"""`warmup.sft.completion_loss` against a plain oracle: each example's prompt and target in one
forward with no cache, the cross-entropy over the target tokens, averaged over all of them."""

from __future__ import annotations

import pytest
import torch

from compassplay.warmup import sft
from compassplay.warmup.sft import SFTExample, completion_loss, shared_prompt_prefix
from tests.tiny_models import tiny_causal_lm


def oracle_loss(model: torch.nn.Module, batch: list[SFTExample]) -> torch.Tensor:
    """Token-mean cross-entropy of every target token, one example per forward."""
    total, count = torch.zeros(()), 0
    for e in batch:
        ids = torch.tensor([e.prompt + e.target])
        logits = model(input_ids=ids, use_cache=False).logits[0, len(e.prompt) - 1:-1]
        total = total + torch.nn.functional.cross_entropy(
            logits.float(), torch.tensor(e.target), reduction="sum")
        count += len(e.target)
    return total / count


def batch_with_shared_prefix(shared: int) -> list[SFTExample]:
    g = torch.Generator().manual_seed(1)
    common = torch.randint(0, 256, (shared,), generator=g).tolist()
    out = []
    for rest, target in ((5, 4), (2, 7), (12, 2)):  # rests and targets of unequal lengths
        own = torch.randint(0, 256, (rest,), generator=g).tolist()
        tgt = torch.randint(0, 256, (target,), generator=g).tolist()
        out.append(SFTExample("k", common + own, tgt))
    return out


@pytest.mark.parametrize("shared", [0, 24])
def test_completion_loss_equals_the_plain_forward(shared):
    """With a shared prompt prefix run once (24 tokens) and without (0): the loss equals the
    oracle's up to float summation order. (Its gradient is not the oracle's by design: the
    prompt runs without gradient, so nothing flows through the prompt's keys and values.)"""
    model = tiny_causal_lm(seed=3).eval()
    batch = batch_with_shared_prefix(shared)
    assert shared_prompt_prefix([e.prompt[:-1] for e in batch]) == shared
    with torch.no_grad():
        torch.testing.assert_close(completion_loss(model, batch, pad_id=259),
                                   oracle_loss(model, batch), atol=1e-5, rtol=1e-5)


def test_sharing_changes_neither_the_loss_nor_its_gradient(monkeypatch):
    """The prefix pass against the same batch with sharing off: equal loss and gradients
    (float summation order apart)."""
    model = tiny_causal_lm(seed=4).eval()
    batch = batch_with_shared_prefix(30)
    params = list(model.parameters())
    shared = completion_loss(model, batch, pad_id=259)
    grads = torch.autograd.grad(shared, params)
    monkeypatch.setattr(sft, "SHARED_PREFIX_MIN", 10_000)  # no prefix pass
    assert shared_prompt_prefix([e.prompt[:-1] for e in batch]) == 0
    plain = completion_loss(model, batch, pad_id=259)
    torch.testing.assert_close(plain, shared, atol=1e-6, rtol=1e-6)
    for g, w in zip(torch.autograd.grad(plain, params), grads, strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-4)


def test_the_shared_prefix_leaves_each_prompt_a_token_of_its_own():
    assert shared_prompt_prefix([list(range(40))] * 3) == 39
    assert shared_prompt_prefix([list(range(40))]) == 0  # one example: nothing to share
    assert shared_prompt_prefix([list(range(40)), list(range(10)) + [99] * 30]) == 0  # < 16
    assert shared_prompt_prefix([list(range(40)), list(range(20)) + [99] * 5]) == 20
