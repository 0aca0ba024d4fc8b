"""Tiny random-weight causal LMs and an independent autograd oracle for the scorer tests."""

from __future__ import annotations

import pytest
import torch

from compassplay.rewards.gradient import Example

VOCAB = 61


def tiny_model(kind: str, tied: bool, seed: int = 0) -> torch.nn.Module:
    """A 2-layer model of a few thousand parameters (eval mode, float32)."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied,
                  max_position_embeddings=1024)
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common, attention_bias=True))
    elif kind == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=4,
                                           n_positions=1024, tie_word_embeddings=tied,
                                           bos_token_id=0, eos_token_id=0))
    else:
        raise ValueError(kind)
    return model.float()


def called_with_a_keyword(module: torch.nn.Module) -> torch.nn.Module:
    """`module` inside a wrapper that calls it as `module(x, scale=1.5)` (its output times 1.5):
    a call outside the per-sample hooks' patterns, so the engine declines the module."""
    orig, call = module.forward, type(module).__call__
    module.forward = lambda x, scale=1.0: orig(x) * scale

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module

        def forward(self, x):
            return call(self.inner, x, scale=1.5)

    return Wrapped()


def rand_example(gen: torch.Generator, prompt: int, target: int) -> Example:
    ids = torch.randint(0, VOCAB, (prompt + target,), generator=gen).tolist()
    return Example(ids[:prompt], ids[prompt:])


def loss_of(model: torch.nn.Module, ex: Example) -> torch.Tensor:
    """Mean token CE of the target given the prompt, written independently of the package."""
    ids = torch.tensor([list(ex.prompt_ids) + list(ex.target_ids)])
    logits = model(input_ids=ids).logits[0].float()
    p, t = len(ex.prompt_ids), torch.tensor(ex.target_ids)
    logp = torch.log_softmax(logits[p - 1: p - 1 + len(t)], dim=-1)
    return -logp[torch.arange(len(t)), t].mean()


def oracle(model, ref, cands, names=None, project=None):
    """(cosine, inner, grad_norm) per candidate: one autograd.grad per candidate, flattened
    (a candidate given as a list of Examples: of the mean of their losses).

    `project(name, param, grad) -> (dim,)` optionally maps each parameter block (projection)."""
    was = model.training
    model.eval()
    named = [(n, p) for n, p in model.named_parameters()
             if p.requires_grad and (names is None or n in names)]
    params = [p for _, p in named]

    def flat(grads):
        if project is None:
            return torch.cat([g.reshape(-1).double() for g in grads])
        return sum(project(n, p, g).double() for (n, p), g in zip(named, grads, strict=True))

    g_ref = flat(torch.autograd.grad(torch.stack([loss_of(model, e) for e in ref]).mean(),
                                     params))
    out = []
    for c in cands:  # an Example, or a list of them: the mean of their losses
        loss = loss_of(model, c) if isinstance(c, Example) else torch.stack(
            [loss_of(model, e) for e in c]).mean()
        g = flat(torch.autograd.grad(loss, params))
        inner, norm = float(g @ g_ref), float(g.norm())
        den = norm * float(g_ref.norm())
        out.append((inner / den if den > 0 else 0.0, inner, norm))
    model.train(was)
    return out


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)
