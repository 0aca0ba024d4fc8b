"""The buffered batch sampler (`TokenSampler`) against the plain rule (`sample_next`) and the
plain log-softmax: the same tokens and log-probs, bit for bit, step after step."""

from __future__ import annotations

import pytest
import torch

from compassplay.engines.generation.sampling import TokenSampler, draw, sample_next


def old_draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The engine's draw before the buffers (float64 copy, then its running sums)."""
    cum = probs.double().cumsum(dim=-1)
    u = torch.rand((probs.shape[0], 1), generator=generator, dtype=torch.float64) * cum[:, -1:]
    return torch.searchsorted(cum, u, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def test_draw_into_a_buffer_equals_the_float64_copy_draw():
    probs = torch.softmax(torch.randn(6, 5000, generator=torch.Generator().manual_seed(0)) * 4,
                          dim=-1)
    buf = torch.empty(6, 5000, dtype=torch.float64)
    a, b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    for _ in range(20):
        assert torch.equal(draw(probs, a, out=buf), old_draw(probs, b))


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (0.8, 0.9), (0.0, 1.0),
                                               (1.0, 0.5)])
def test_token_sampler_equals_sample_next_and_log_softmax(temperature, top_p):
    rows, vocab = 5, 3000
    g = torch.Generator().manual_seed(4)
    sampler = TokenSampler(rows, vocab, "cpu")
    a, b = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    kept = []
    for _ in range(12):
        logits = torch.randn(rows, vocab, generator=g) * 3
        tok = sampler.sample(logits, temperature, top_p, a)
        assert torch.equal(tok, sample_next(logits, temperature, top_p, b))
        lp = sampler.logprobs(logits, tok)
        assert torch.equal(lp, torch.log_softmax(logits, dim=-1).gather(-1, tok[:, None])
                           .squeeze(-1))
        kept.append((tok.clone(), lp.clone(), tok, lp))
    assert all(torch.equal(t0, t1) and torch.equal(l0, l1) for t0, l0, t1, l1 in kept)


def test_token_sampler_masks_into_its_buffer_and_falls_back_on_other_shapes():
    sampler = TokenSampler(2, 10, "cpu")
    logits = torch.arange(20, dtype=torch.float32).view(2, 10)
    masked = sampler.masked(logits, torch.tensor([9, 3]))
    assert torch.isinf(masked[:, [3, 9]]).all() and torch.equal(masked[:, :3], logits[:, :3])
    assert logits[0, 9] == 9  # the input is untouched
    assert torch.equal(sampler.masked(logits, torch.tensor([], dtype=torch.long)), logits)
    g = torch.Generator().manual_seed(0)
    wide = torch.randn(3, 12)
    assert sampler.sample(wide, 1.0, 1.0, g).shape == (3,)
    assert sampler.logprobs(wide, torch.tensor([0, 1, 2])).shape == (3,)
