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

from collections.abc import Callable, Hashable

import torch

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


def hidden_after_prefix(base: torch.nn.Module, input_ids: torch.Tensor,
                        attention_mask: torch.Tensor, p: int) -> torch.Tensor:
    """The last hidden states [B, L - p, H] at positions p..L-1 of `input_ids` [B, L], with
    positions 0..p-1 (equal in every row, `shared_prefix_len`) computed once. `base` is the
    transformers base model (`model.base_model`); it runs in whatever autocast/grad mode the
    caller set."""
    bsz, width = input_ids.shape
    head = base(input_ids=input_ids[:1, :p], attention_mask=attention_mask[:1, :p],
                use_cache=True)
    cache = head.past_key_values
    cache.batch_repeat_interleave(bsz)
    pos = torch.arange(p, width, device=input_ids.device)[None].expand(bsz, -1)
    return base(input_ids=input_ids[:, p:], attention_mask=attention_mask,
                position_ids=pos, past_key_values=cache, use_cache=True).last_hidden_state


def grouped_by(items: list[int], key: Callable[[int], Hashable]) -> list[int]:
    """`items` with equal keys made adjacent: groups in order of first appearance, each in
    its original order (an order whose equal keys are already adjacent is returned as is)."""
    groups: dict[Hashable, list[int]] = {}
    for i in items:
        groups.setdefault(key(i), []).append(i)
    return [i for group in groups.values() for i in group]
