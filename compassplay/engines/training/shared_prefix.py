"""One forward of a prompt prefix that every row of a micro-batch shares.

The learner's rows often begin with the same tokens: the solver's n samples of one task have
one prompt, and the proposer's prompts of one task type share their instruction text (about
250 of 400 tokens for SmolLM2's code prompts). A decoder's hidden states at a position depend
only on the tokens up to it, so those P shared positions have the same activations in every
row: they are computed once (one row, `use_cache=True`), their keys and values repeated for
the B rows, and the rest of each row runs against them. Gradients flow through the repeated
keys and values into the one prefix pass, so the loss and its gradient are those of the plain
padded forward (the same sums in another order). The work saved is (B - 1) x P positions of
every block, forward and backward.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from compassplay.engines.generation.prefix_plan import sorted_with_lcp

MIN_SHARED = 16  # positions: below this a second forward call costs more than it saves
# architectures whose forward with a repeated cache equals the padded forward
# (tests/engines/training/test_learner_shared_prefix.py)
SHARED_PREFIX_TYPES = ("llama", "qwen2", "gpt2")


def supports_shared_prefix(model: torch.nn.Module) -> bool:
    """Whether `model` (a transformers causal LM) may take `hidden_after_prefix`: one of
    `SHARED_PREFIX_TYPES`, not recomputing activations (gradient checkpointing's forward
    keeps no cache) and drawing no dropout (one pass of the prefix would share its masks
    among the rows)."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "model_type", None) not in SHARED_PREFIX_TYPES or \
            getattr(model, "is_gradient_checkpointing", False):
        return False
    return not model.training or not (
        float(getattr(cfg, "attention_dropout", 0.0) or 0.0) > 0
        or any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()))


def shared_prefix_len(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      positions: torch.Tensor, min_len: int = MIN_SHARED) -> int:
    """P: how many leading tokens every row of `input_ids` [B, L] has in common and may be
    computed once, or 0 (one row, or fewer than `min_len`). P stays at or below each row's
    first needed position (`positions` [B, L-1] nonzero: the hidden state at position t gives
    target t), so every needed hidden state comes from the rows' own pass; the shared tokens
    are real ones (`attention_mask` [B, L] is 1 there: right padding)."""
    bsz, width = input_ids.shape
    if bsz < 2 or width < 2:
        return 0
    same = (input_ids == input_ids[:1]).all(0) & attention_mask.bool().all(0)   # [L]
    differ = (~same).nonzero()
    common = int(differ[0]) if differ.numel() else width
    needed = positions.bool().any(0).nonzero()                                  # [L-1]
    first = int(needed[0]) if needed.numel() else width - 1
    p = min(common, first, width - 1)
    return p if p >= min_len else 0


def hidden_after_prefix(base: torch.nn.Module, input_ids: torch.Tensor | None,
                        attention_mask: torch.Tensor, p: int,
                        inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
    """The last hidden states [B, L - p, H] at positions p..L-1 of `input_ids` [B, L] (or of
    `inputs_embeds` [B, L, H] in their place: the states entering the first layer `base`
    runs, `frozen_prefix.layers_from(..., renumber=True)`), with positions 0..p-1 (equal in
    every row, `shared_prefix_len`) computed once. `base` is the transformers base model
    (`model.base_model`); it runs in whatever autocast/grad mode the caller set."""
    src = input_ids if inputs_embeds is None else inputs_embeds
    bsz, width = src.shape[:2]
    kind = "input_ids" if inputs_embeds is None else "inputs_embeds"
    head = base(**{kind: src[:1, :p]}, attention_mask=attention_mask[:1, :p], use_cache=True)
    cache = head.past_key_values
    cache.batch_repeat_interleave(bsz)
    pos = torch.arange(p, width, device=src.device)[None].expand(bsz, -1)
    return base(**{kind: src[:, p:]}, attention_mask=attention_mask,
                position_ids=pos, past_key_values=cache, use_cache=True).last_hidden_state


CHUNK_OVERHEAD = 64  # token positions a micro-batch's own passes cost beyond its tokens


def prefix_chunks(prompts: Sequence[Sequence[int]], lengths: Sequence[int], size: int,
                  min_len: int = MIN_SHARED, overhead: int = CHUNK_OVERHEAD
                  ) -> list[list[int]]:
    """Micro-batches of at most `size` of rows 0..n-1 (row i: prompt token ids `prompts[i]`,
    `lengths[i]` tokens with its completion), chosen so that the positions their passes
    compute are fewest. A micro-batch of r rows padded to width W whose rows share a prefix
    of P tokens (`shared_prefix_len`: at most every row's prompt but its last token, and only
    from `min_len` on) computes P + r (W - P) positions, plus `overhead` for its own passes.

    The rows are taken in the lexicographic order of their prompts (rows with a common
    prefix, equal prompts first of all, are then adjacent) and cut into consecutive runs by
    dynamic programming. The proposer's prompts of one task type share 200-250 tokens while
    the types share only the chat template's opening; chunks of `size` in arrival order mixed
    the types and shared nothing (tests). The loss and gradient do not depend on the cut (the
    learner's normalizer counts every token of the step)."""
    n = len(prompts)
    order, lcp = sorted_with_lcp(prompts)
    best, cut = [0] + [float("inf")] * n, [0] * (n + 1)
    for end in range(1, n + 1):
        common, width, shortest = None, 0, None
        for start in range(end - 1, max(0, end - size) - 1, -1):
            row = order[start]
            width = max(width, lengths[row])
            shortest = len(prompts[row]) if shortest is None else \
                min(shortest, len(prompts[row]))
            if start < end - 1:
                common = lcp[start] if common is None else min(common, lcp[start])
            rows = end - start
            shared = 0 if common is None else min(common, shortest - 1, width - 1)
            shared = shared if shared >= min_len else 0
            cost = best[start] + shared + rows * (width - shared) + overhead
            if cost < best[end]:
                best[end], cut[end] = cost, start
    chunks, end = [], n
    while end:
        chunks.append(order[cut[end]:end])
        end = cut[end]
    return chunks[::-1]
