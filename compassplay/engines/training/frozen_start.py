"""The learner's forward from the generators' states (`engines.frozen_states`).

`FrozenStart(model)` finds k, the lowest decoder layer holding a trainable parameter, and
turns a micro-batch's handed states into the `states` input of `token_logprobs_entropy`:
[B, L-1, H] at the packed batch's positions 0..L-2 (right padding, zeros at pads). A
micro-batch is taken from states only when every row has its own, of its length; otherwise
it runs the full forward (counted in `rows_recomputed`). The first micro-batch taken is
compared with the model's own forward of the frozen layers: a difference above
`frozen_states.MAX_RELATIVE_DIFF` of the states' scale (`AUTOCAST_RELATIVE_DIFF` for a
learner under bfloat16 autocast, checked in its own numerics; other weights below k, another
precision) turns the hand-over off for the rest of the run, with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from compassplay.engines.frozen_states import AUTOCAST_RELATIVE_DIFF, MAX_RELATIVE_DIFF
from compassplay.rewards.frozen_prefix import decoder, forward_entering, lowest_layer_of

log = logging.getLogger(__name__)


class FrozenStart:
    """Per trained model: k, whether the hand-over is on, and its counts. autocast: the
    learner's forward dtype under `torch.autocast` (None: none), which its check runs in."""

    def __init__(self, model: torch.nn.Module, autocast: torch.dtype | None = None) -> None:
        self.model = model
        self.autocast = autocast
        self.tolerance = MAX_RELATIVE_DIFF if autocast is None else AUTOCAST_RELATIVE_DIFF
        dec = decoder(model)
        k = lowest_layer_of(model, [p for p in model.parameters() if p.requires_grad])
        self.k = k if dec is not None and 0 < k < len(dec.layers) else 0
        self.checked_diff: float | None = None  # the first check's relative difference
        self.rows_from_states = 0
        self.rows_recomputed = 0

    @property
    def enabled(self) -> bool:
        return self.k > 0

    def states_for(self, states: Sequence[torch.Tensor | None], batch: dict[str, torch.Tensor]
                   ) -> torch.Tensor | None:
        """[B, L-1, H] for `batch` (`logprobs.pack`'s, B rows of width L) from each row's
        states [len_i - 1, H] (None where a row has none: then None, the full forward)."""
        if not self.enabled:
            return None
        attn = batch["attention_mask"][:, 1:]  # a row of n tokens hands over n - 1 states
        lengths = attn.sum(1).tolist()
        if any(s is None or s.shape[0] != n for s, n in zip(states, lengths, strict=True)):
            self.rows_recomputed += len(states)
            return None
        dev = attn.device
        out = torch.zeros((*attn.shape, states[0].shape[1]), device=dev)
        for i, (s, n) in enumerate(zip(states, lengths, strict=True)):
            out[i, :n] = s.to(dev, torch.float32)
        if self.checked_diff is None and not self._agrees(out, batch):
            self.k = 0
            self.rows_recomputed += len(states)
            return None
        self.rows_from_states += len(states)
        return out

    def _agrees(self, handed: torch.Tensor, batch: dict[str, torch.Tensor]) -> bool:
        """Whether `handed` equals this model's own states entering layer k on the batch's
        shortest row (one frozen forward of n - 1 positions, under the learner's autocast),
        to `tolerance` of their largest magnitude (logged)."""
        lengths = batch["attention_mask"][:, 1:].sum(1)
        j, n = int(lengths.argmin()), int(lengths.min())
        ids = batch["input_ids"][j:j + 1, :n]
        with torch.no_grad(), torch.autocast(ids.device.type,
                                             dtype=self.autocast or torch.bfloat16,
                                             enabled=self.autocast is not None):
            own = forward_entering(self.model, self.k, input_ids=ids).float()
        diff = float((handed[j, :n] - own[0]).abs().max())
        scale = float(own.abs().max())
        self.checked_diff = diff / max(scale, 1e-30)
        if self.checked_diff > self.tolerance:
            log.warning("learner.frozen_states: the generators' states entering layer %d differ "
                        "from the learner's own by %.2e of their scale (> %.0e): the learner "
                        "runs every layer from now on", self.k, self.checked_diff,
                        self.tolerance)
            return False
        log.info("learner.frozen_states: forwards start at layer %d from the generators' "
                 "states (checked once: %.1e of their scale from the learner's own)", self.k,
                 self.checked_diff)
        return True
