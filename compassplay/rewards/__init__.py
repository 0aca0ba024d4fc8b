"""Proposer rewards: the batched gradient-alignment scorer (`rewards.gradient`) and pure reward
functions (`rewards.functions`). Import the submodules directly; this package imports nothing
heavy on its own."""
