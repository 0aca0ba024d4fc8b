"""Teacher-forced per-token log-probs of completions (the learner's side of the PPO ratio)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from compassplay.engines.training.shared_prefix import (
    hidden_after_prefix,
    shared_prefix_len,
    supports_shared_prefix,
)
from compassplay.records import Generation
from compassplay.rewards.batch import HEAD_ON_HIDDEN_TYPES
from compassplay.rewards.frozen_prefix import layers_from

ENTROPY_ROWS = 1024  # positions per chunk of the entropy computation


def pack(gens: Sequence[Generation], pad_token_id: int = 0, device: torch.device | None = None
         ) -> dict[str, torch.Tensor]:
    """Right-padded prompt+completion batch.

    Returns input_ids/attention_mask [B, L] and, shifted by one ([B, L-1]): targets (next
    token), mask (1 where the target is a completion token) and old_logp (the recorded
    behaviour log-probs at those positions, 0 elsewhere).
    """
    width = max(len(g.prompt_ids) + len(g.completion_ids) for g in gens)
    bsz = len(gens)
    ids = torch.full((bsz, width), pad_token_id, dtype=torch.long)
    attn = torch.zeros((bsz, width), dtype=torch.long)
    mask = torch.zeros((bsz, width - 1), dtype=torch.float32)
    old = torch.zeros((bsz, width - 1), dtype=torch.float32)
    for i, g in enumerate(gens):
        if len(g.logprobs) != len(g.completion_ids):
            raise ValueError(f"generation {i}: {len(g.completion_ids)} tokens but "
                             f"{len(g.logprobs)} log-probs")
        p, c = len(g.prompt_ids), len(g.completion_ids)
        ids[i, :p + c] = torch.tensor(g.prompt_ids + g.completion_ids, dtype=torch.long)
        attn[i, :p + c] = 1
        mask[i, p - 1:p + c - 1] = 1.0
        old[i, p - 1:p + c - 1] = torch.tensor(g.logprobs, dtype=torch.float32)
    out = {"input_ids": ids, "attention_mask": attn, "targets": ids[:, 1:].clone(),
           "mask": mask, "old_logp": old}
    return {k: v.to(device) for k, v in out.items()} if device is not None else out


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor, targets: torch.Tensor,
                   positions: torch.Tensor | None = None,
                   autocast: torch.dtype | None = None) -> torch.Tensor:
    """log p(targets[:, t] | input_ids[:, :t+1]) at temperature 1, float32 [B, L-1] (nats).
    positions, autocast: see `token_logprobs_entropy`."""
    return token_logprobs_entropy(model, input_ids, attention_mask, targets, positions,
                                  autocast)[0]


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside DeepSpeed's engine (its `module`), else `model`. Its
    submodules carry ZeRO-3's gather hooks, so calling them directly is what the engine's own
    forward does; the backward still goes through the engine (`engine.backward`)."""
    if type(model).__name__ == "DeepSpeedEngine" and isinstance(
            getattr(model, "module", None), torch.nn.Module):
        return model.module
    return model


def head_on_hidden(model: torch.nn.Module) -> bool:
    """Whether `model`'s logits (or, for DeepSpeed's engine, its module's) are the output
    embedding on the base model's hidden states: a transformers model of those types."""
    from transformers import PreTrainedModel

    model = unwrapped(model)
    kind = getattr(getattr(model, "config", None), "model_type", None)
    return isinstance(model, PreTrainedModel) and kind in HEAD_ON_HIDDEN_TYPES and \
        model.get_output_embeddings() is not None


def token_logprobs_entropy(model: torch.nn.Module, input_ids: torch.Tensor,
                           attention_mask: torch.Tensor, targets: torch.Tensor,
                           positions: torch.Tensor | None = None,
                           autocast: torch.dtype | None = None, share_prefix: bool = False,
                           states: torch.Tensor | None = None, from_layer: int = 0
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(`token_logprobs`, the policy's entropy at each position), both float32 [B, L-1] in
    nats at temperature 1; the entropy is detached (a logged statistic, no gradient).

    positions: [B, L-1], nonzero where the values are needed (the completion tokens). Where
    the architecture allows (`head_on_hidden`) only those rows go through the vocabulary head
    and its log-softmax (a prompt of 500 tokens before a completion of 20 would otherwise be
    ~96% of that work), and the other positions are 0; else every position is computed.

    autocast: the base model's forward under `torch.autocast` in this dtype (its matmuls round
    their inputs to it and accumulate in float32; the residual stream and norms of a Llama or
    Qwen2 model stay float32), with the vocabulary head and log-softmax in float32 on the
    float32 hidden states. Only on the `head_on_hidden` path, where the head can be kept out
    of it: elsewhere the forward stays in the weights' dtype.

    share_prefix: on the same path, leading tokens that every row has in common (up to the
    first needed position) are computed once (`shared_prefix.supports_shared_prefix` says
    where).

    states [B, L-1, H]: the hidden states entering decoder layer `from_layer` at positions
    0..L-2 (`engines.frozen_states`; a row of n tokens has n - 1, the rest are masked as
    padding, `attention_mask[:, 1:]`); the forward then runs only layers
    `from_layer`.. from them (the `head_on_hidden` path; `positions` required). Layers below
    carry no gradient, so the log-probs and their gradient are those of the full forward
    wherever the states are the ones it computes."""
    if states is not None and (positions is None or not head_on_hidden(model)):
        raise ValueError("token_logprobs_entropy: states need `positions` and a model whose "
                         "head acts on the base model's hidden states")
    if positions is None or not head_on_hidden(model):
        logits = model(input_ids=input_ids, attention_mask=attention_mask,
                       use_cache=False).logits
        logp_all = torch.log_softmax(logits[:, :-1, :].float(), dim=-1)
        return logp_all.gather(-1, targets[..., None]).squeeze(-1), entropy_of(logp_all)
    model = unwrapped(model)
    p = shared_prefix_len(input_ids, attention_mask, positions) \
        if share_prefix and supports_shared_prefix(model) else 0
    with torch.autocast(input_ids.device.type, dtype=autocast or torch.bfloat16,
                        enabled=autocast is not None):
        if states is not None:  # positions 0..L-2 from layer `from_layer` on
            with layers_from(model, from_layer, renumber=True):
                hidden = _hidden(model.base_model, None, attention_mask[:, 1:], p, states)
        else:
            hidden = _hidden(model.base_model, input_ids, attention_mask, p)[:, :-1]
    sel = positions.bool()
    head = model.get_output_embeddings()
    rows = hidden[sel[:, p:]]
    if autocast is not None:
        rows = rows.to(head.weight.dtype)
    logp_all = torch.log_softmax(head(rows).float(), dim=-1)              # [N, V]
    lp = logp_all.gather(-1, targets[sel][:, None]).squeeze(-1)
    zeros = torch.zeros(sel.shape, dtype=lp.dtype, device=lp.device)
    return zeros.masked_scatter(sel, lp), zeros.masked_scatter(sel, entropy_of(logp_all))


def _hidden(base: torch.nn.Module, input_ids: torch.Tensor | None,
            attention_mask: torch.Tensor, p: int, states: torch.Tensor | None = None
            ) -> torch.Tensor:
    """The base model's last hidden states at positions p.. (p > 0: the shared prefix once)."""
    if p:  # hidden states at positions p.. only; the ones before are never needed
        return hidden_after_prefix(base, input_ids, attention_mask, p) if states is None \
            else hidden_after_prefix(base, None, attention_mask, p, inputs_embeds=states)
    if states is not None:
        return base(inputs_embeds=states, attention_mask=attention_mask,
                    use_cache=False).last_hidden_state
    return base(input_ids=input_ids, attention_mask=attention_mask,
                use_cache=False).last_hidden_state


@torch.no_grad()
def entropy_of(logp_all: torch.Tensor, rows: int = ENTROPY_ROWS) -> torch.Tensor:
    """-sum_v p log p over the last axis of log-probs [..., V] (nats), `rows` positions at a
    time so the temporaries stay at rows x V floats (a 150k vocabulary: 0.6 GB per 1,024)."""
    flat = logp_all.reshape(-1, logp_all.shape[-1])
    out = torch.empty(flat.shape[0], dtype=flat.dtype, device=flat.device)
    for k in range(0, flat.shape[0], rows):
        part = flat[k:k + rows]
        out[k:k + rows] = -(part.exp() * part).sum(-1)
    return out.reshape(logp_all.shape[:-1])
