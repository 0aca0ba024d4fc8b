"""The scoring path of a step: candidates -> per-shard partials -> merge -> cosines -> rewards.

Scorer shards return additive partials (`ScoredShard`); `merge_shards` sums them and finalizes
(cosine, inner, grad_norm) per candidate, exactly as one unsharded scorer would; the learner
then calls `stages.assign_rewards` with the result. A candidate is scored on all its verified
solutions (`candidate_solutions`): its partials are those of the mean of their losses, so
shards merge them like any other.
"""

from __future__ import annotations

import torch

from compassplay.records import Candidate
from compassplay.rewards.alignment import Partials, finalize
from compassplay.rewards.batch import Example
from compassplay.rewards.local_reference import finalize_local
from compassplay.step.messages import ScoredShard

Alignment = dict[str, tuple[float, float, float]]  # task_id -> (cosine, inner, grad_norm)


def candidate_solutions(cands: list[Candidate]) -> list[list[Example]]:
    """Per candidate, one scorer Example per verified solution (`Candidate.solutions`): the
    scorer's g(x) is the gradient of their mean loss."""
    return [[Example(list(c.prompt_ids), list(t)) for t in c.solutions] for c in cands]


def merge_shards(shards: list[ScoredShard], param_shard: bool = False
                 ) -> tuple[list[Candidate], Alignment]:
    """Sum partials over shards and finalize cosines: {task_id: (cosine, inner, grad_norm)}.

    Replica shards partition the candidates (each holds the full reference norm); parameter
    shards partition the parameters, so their reference partials add up too.
    """
    if not shards:
        return [], {}
    if any(s.local_ref_sq is not None for s in shards):
        return merge_local(shards)
    cands = shards[0].cands
    n = len(cands)
    inner = torch.zeros(n, dtype=torch.float64)
    sq = torch.zeros(n, dtype=torch.float64)
    proj = None
    ref_sq = 0.0
    ref_proj = None
    for s in shards:
        if not s.index:
            continue
        ix = torch.tensor(s.index)
        inner.index_add_(0, ix, torch.tensor(s.inner, dtype=torch.float64))
        sq.index_add_(0, ix, torch.tensor(s.sq, dtype=torch.float64))
        if s.proj is not None:
            p = torch.tensor(s.proj, dtype=torch.float64)
            proj = torch.zeros(n, p.shape[1], dtype=torch.float64) if proj is None else proj
            proj.index_add_(0, ix, p)
            rp = torch.tensor(s.ref_proj, dtype=torch.float64)
            ref_proj = rp if ref_proj is None or not param_shard else ref_proj + rp
        ref_sq = ref_sq + s.ref_sq if param_shard else s.ref_sq
    if not any(s.index for s in shards):
        return cands, {}
    scores = finalize(Partials(inner, sq, proj), ref_sq, ref_proj)
    return cands, {c.task_id: (r.cosine, r.inner, r.grad_norm)
                   for c, r in zip(cands, scores, strict=True)}


def merge_local(shards: list[ScoredShard]) -> tuple[list[Candidate], Alignment]:
    """Local references (reward.reference=local): each candidate has its own |g_ref|^2; every
    partial (inner, sq, ref_sq) sums over shards (candidate slices or parameter slices)."""
    cands = shards[0].cands
    acc = torch.zeros(3, len(cands), dtype=torch.float64)
    seen: set[int] = set()
    for s in shards:
        if not s.index:
            continue
        ix = torch.tensor(s.index)
        part = torch.tensor([s.inner, s.sq, s.local_ref_sq], dtype=torch.float64)
        acc.index_add_(1, ix, part)
        seen.update(s.index)
    scores = finalize_local(*acc.tolist())
    return cands, {c.task_id: scores[i] for i, c in enumerate(cands) if i in seen}


def merge_utility(shards: list[ScoredShard]) -> dict[str, float]:
    """SOAR utilities of all shards (each shard owns distinct candidate groups)."""
    return {k: v for s in shards for k, v in s.utility.items()}


def merge_soar(shards: list[ScoredShard]) -> dict:
    """SOAR's cost over all shards, as StepStats fields (empty when no shard ran SOAR):
    soar_seconds (summed over shards: the copies' training and held-out evaluation),
    soar_train_tokens, soar_eval_tokens, soar_groups."""
    runs = [s.soar for s in shards if s.soar]
    if not runs:
        return {}
    out = {k: sum(r.get(k, 0.0) for r in runs) for k in
           ("soar_seconds", "soar_train_tokens", "soar_eval_tokens", "soar_groups")}
    return {k: (v if k == "soar_seconds" else int(v)) for k, v in out.items()}
