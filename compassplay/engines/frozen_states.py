"""Hidden states handed from the generators to the learner: the residual stream entering the
learner's lowest trained block k, at every position a sampled sequence's decode computed.

A learner that trains only blocks k.. (`learner.trainable: last:6` takes SmolLM2's top 6 of
30) needs, below block k, only the states entering it; those are a function of the tokens
and of the frozen weights alone, which the generators hold unchanged. A generator's static
decoder (float32 or bfloat16 matmuls; its residual stream is float32 in both) keeps them
while it decodes (`StaticDecoder.capture_layer`) for each sequence's prompt and
every completion token but the last (the last one predicts nothing), and the learner starts
its forward from them (`learner.frozen_states`). The learner compares them once with its own
frozen forward, in its own numerics, and stops taking them if they differ by more than
`MAX_RELATIVE_DIFF` (float32) or `AUTOCAST_RELATIVE_DIFF` (bfloat16 autocast).

States travel keyed by the sequence's tokens (`states_key`), so the records stay plain JSON
and a sequence is matched wherever it went (validation, grading, copies). Size: (prompt +
completion - 1) x hidden float32 per sequence: 0.9 MB for 400 tokens of SmolLM2's 576.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np
import torch

FrozenStates = Mapping[str, torch.Tensor]  # states_key -> [P + C - 1, H] float32
# the learner's check of the handed states against its own frozen forward: max |diff| over
# max |own| (float32 both sides differ by summation order only: ~1e-6 measured)
MAX_RELATIVE_DIFF = 1e-4
# the same under bfloat16 autocast, where a bfloat16 decoder's states and the learner's own
# round in other orders: 4e-5 to 1.2e-4 measured for SmolLM2's block 24 (8 sampled sequences,
# docs/measurements/bf16-small-rows-2026-12-07e), 3.9e-3 for a random 4-block model of hidden
# size 64 (tests); states of other weights or positions differ by O(1) (1.8 there)
AUTOCAST_RELATIVE_DIFF = 2e-2


def states_key(prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> str:
    """A digest of one sequence's tokens (the prompt's length included, so a token moved
    across the boundary is another sequence)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(np.asarray([len(prompt_ids)], dtype=np.int64).tobytes())
    h.update(np.asarray(list(prompt_ids) + list(completion_ids), dtype=np.int64).tobytes())
    return h.hexdigest()


def states_positions(prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> int:
    """Positions whose states a sequence hands over: every token but the last."""
    return max(len(prompt_ids) + len(completion_ids) - 1, 0)
