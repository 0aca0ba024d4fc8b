"""Log-probs at the completion positions only, against the full-vocabulary oracle."""

from __future__ import annotations

import pytest
import torch

from compassplay.engines.training.logprobs import head_on_hidden, pack, token_logprobs_entropy
from compassplay.records import Generation
from tests.tiny_models import tiny_causal_lm


def _batch():
    gens = [Generation(prompt_ids=[5, 6, 7, 8, 9], completion_ids=[10, 11, 258],
                       logprobs=[-1.0, -2.0, -3.0], text="", weight_version=0),
            Generation(prompt_ids=[12, 13], completion_ids=[14, 15, 16, 17, 18],
                       logprobs=[-1.0] * 5, text="", weight_version=0)]
    return pack(gens)


def test_selected_positions_equal_the_full_head_and_its_gradient():
    model = tiny_causal_lm(seed=2)
    assert head_on_hidden(model)
    b = _batch()
    full_lp, full_ent = token_logprobs_entropy(model, b["input_ids"], b["attention_mask"],
                                               b["targets"])
    (full_lp * b["mask"]).sum().backward()
    full_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    lp, ent = token_logprobs_entropy(model, b["input_ids"], b["attention_mask"], b["targets"],
                                     b["mask"])
    (lp * b["mask"]).sum().backward()
    sel = b["mask"].bool()
    torch.testing.assert_close(lp[sel], full_lp[sel])
    torch.testing.assert_close(ent[sel], full_ent[sel])
    assert (lp[~sel] == 0).all() and (ent[~sel] == 0).all()
    for got, want in zip((p.grad for p in model.parameters()), full_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_a_wrapped_module_takes_the_full_path():
    class Wrapper(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def forward(self, **kw):
            return self.inner(**kw)

    wrapped = Wrapper(tiny_causal_lm(seed=2))
    assert not head_on_hidden(wrapped)
    b = _batch()
    lp, _ = token_logprobs_entropy(wrapped, b["input_ids"], b["attention_mask"], b["targets"],
                                   b["mask"])
    assert (lp != 0).all()  # every position computed


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_other_architectures_agree_too(arch):
    from tests.engines.generation.test_static_decoder import tiny

    model = tiny(arch)
    b = _batch()
    full, _ = token_logprobs_entropy(model, b["input_ids"], b["attention_mask"], b["targets"])
    part, _ = token_logprobs_entropy(model, b["input_ids"], b["attention_mask"], b["targets"],
                                     b["mask"])
    sel = b["mask"].bool()
    torch.testing.assert_close(part[sel], full[sel])
