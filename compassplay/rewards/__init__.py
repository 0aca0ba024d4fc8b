"""Proposer rewards: the batched gradient-alignment scorer (`rewards.gradient`), the scores it
makes of its partials (`rewards.alignment`) and pure reward functions (`rewards.functions`).
Import the submodules directly; this package imports nothing heavy on its own."""
