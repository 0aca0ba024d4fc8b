"""Ranks of the weight-sync group (no Ray): the learner is rank 0, every receiver takes a
contiguous block of ranks, one per process that receives.

A vLLM engine receives in each of its workers, so it takes TP x PP ranks (its workers join as
``rank_offset + rank in the engine's world``, `vllm_worker.compassplay_join_group`); an HF
generator or a scorer takes one. Blocks never overlap, whatever the roles."""

from __future__ import annotations

from compassplay.config import RunConfig


def weight_sync_ranks(sizes: list[int]) -> tuple[list[int], int]:
    """(rank offset of each receiver, world size) for receivers of `sizes` ranks each."""
    if any(s < 1 for s in sizes):
        raise ValueError(f"every receiver needs at least one rank, got sizes {sizes}")
    offsets, nxt = [], 1
    for s in sizes:
        offsets.append(nxt)
        nxt += s
    return offsets, nxt


def receiver_sizes(cfg: RunConfig) -> list[int]:
    """Ranks of each receiver in the driver's order: proposer, solver, then each scorer."""
    def gen(section) -> int:
        return section.tensor_parallel_size if section.engine == "vllm" else 1

    return [gen(cfg.proposer), gen(cfg.solver)] + [1] * cfg.scorer.num_scorers
