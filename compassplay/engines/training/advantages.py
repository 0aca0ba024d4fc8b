"""Task-relative REINFORCE++ advantages (pure functions, no model).

Each trajectory's advantage is its reward normalized within its (task_type, role) group of the
batch: ``(r - mean_g) / std_g`` with the population std (ddof 0). A group whose std is below
`eps` (a singleton, or all rewards equal) gets advantage 0 for all its members, never NaN.

Optionally members of a group carry a subgroup label (reward.normalize=eligible: the eligible
proposals). A labelled subgroup S keeps its mean contrast with the group and has its own
spread standardized: ``(mean_S - mean_g) / std_g + (r - mean_S) / std_S``. So the cosine's
differences among eligible candidates get unit scale instead of the scale the format
penalties set for the whole group; a subgroup of one member, or one whose std is below `eps`,
keeps the plain group advantage.

A trajectory with a `gate` level (reward.normalize=gated_rank, `rewards.shaping`) takes part in
its group through the gate instead of the reward: its advantage is the gate's z-score in the
group (0 when every gate of the group is equal) plus its own `direction` (the bounded rank of
its score among recent eligible candidates). A group must not mix gated and plain members.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence

import torch

from compassplay.records import Trajectory


def _mean_std(vals: list[float]) -> tuple[float, float]:
    mean = sum(vals) / len(vals)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))


def group_normalized(rewards: Sequence[float], groups: Sequence[Hashable],
                     eps: float = 1e-6, subgroups: Sequence[str] | None = None) -> list[float]:
    """Per-element advantage: reward normalized by the mean/std of its group; elements with
    the same non-empty `subgroups` label in a group are standardized among themselves around
    their subgroup's group-normalized mean (module docstring)."""
    if len(rewards) != len(groups):
        raise ValueError(f"{len(rewards)} rewards but {len(groups)} group keys")
    labels = list(subgroups) if subgroups is not None else [""] * len(rewards)
    if len(labels) != len(rewards):
        raise ValueError(f"{len(rewards)} rewards but {len(labels)} subgroup labels")
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    adv = [0.0] * len(rewards)
    for idx in members.values():
        mean, std = _mean_std([float(rewards[i]) for i in idx])
        if std < eps:
            continue
        for i in idx:
            adv[i] = (float(rewards[i]) - mean) / std
        inner: dict[str, list[int]] = defaultdict(list)
        for i in idx:
            if labels[i]:
                inner[labels[i]].append(i)
        for sub in inner.values():
            sub_mean, sub_std = _mean_std([float(rewards[i]) for i in sub])
            if len(sub) < 2 or sub_std < eps:
                continue
            for i in sub:
                adv[i] = (sub_mean - mean) / std + (float(rewards[i]) - sub_mean) / sub_std
    return adv


def trajectory_advantages(trajs: Sequence[Trajectory], eps: float = 1e-6) -> list[float]:
    """Task-relative REINFORCE++: normalize rewards (gate levels, for gated trajectories)
    within each (task_type, role) group, and each labelled subgroup's spread among itself;
    gated trajectories add their `direction`. A trajectory with a fixed `advantage` (a
    supervised example) keeps it and is left out of the groups."""
    free = [i for i, t in enumerate(trajs) if t.advantage is None]
    keys = [(trajs[i].task_type, trajs[i].role) for i in free]
    gated = {k for k, i in zip(keys, free, strict=True) if trajs[i].gate is not None}
    mixed = gated & {k for k, i in zip(keys, free, strict=True) if trajs[i].gate is None}
    if mixed:
        raise ValueError(f"groups {sorted(mixed)} mix gated and plain trajectories")
    values = [trajs[i].gate if trajs[i].gate is not None else trajs[i].reward for i in free]
    normed = group_normalized(values, keys, eps, [trajs[i].subgroup for i in free])
    adv = [float(t.advantage) if t.advantage is not None else 0.0 for t in trajs]
    for i, a in zip(free, normed, strict=True):
        adv[i] = a + (trajs[i].direction if trajs[i].gate is not None else 0.0)
    return adv


def score_share(advantages: Sequence[float], eligible: Sequence[bool],
                groups: Sequence[Hashable]) -> tuple[float, float]:
    """(sum of squares of the advantages of eligible members around their group's eligible
    mean, total sum of squares around the group means), pooled over groups: the first is the
    part only the reward's score decides, the second everything."""
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    within = total = 0.0
    for idx in members.values():
        mean = sum(advantages[i] for i in idx) / len(idx)
        total += sum((advantages[i] - mean) ** 2 for i in idx)
        el = [i for i in idx if eligible[i]]
        if el:
            el_mean = sum(advantages[i] for i in el) / len(el)
            within += sum((advantages[i] - el_mean) ** 2 for i in el)
    return within, total


def proposer_score_share(trajs: Sequence[Trajectory], eligible_ids: set[str]) -> float | None:
    """The share of the proposer trajectories' advantage variance that the reward's score
    decides: plain trajectories, the part that differs between eligible candidates of a group
    (`score_share`); gated ones (normalize=gated_rank), the rank term's part of the
    advantages' sum of squares (`gated_score_share`), so a task alone among the eligible of
    its group counts too. None without proposer trajectories, 0.0 when their advantages do
    not vary."""
    adv = trajectory_advantages(trajs)
    idx = [i for i, t in enumerate(trajs) if t.role == "proposer" and t.advantage is None]
    if not idx:
        return None
    groups = [trajs[i].task_type for i in idx]
    if any(trajs[i].gate is not None for i in idx):
        within, total = gated_score_share([adv[i] - trajs[i].direction for i in idx],
                                          [trajs[i].direction for i in idx])
    else:
        within, total = score_share([adv[i] for i in idx],
                                    [trajs[i].task_id in eligible_ids for i in idx], groups)
    return within / total if total > 0 else 0.0


def gated_score_share(gate_z: Sequence[float], directions: Sequence[float]
                      ) -> tuple[float, float]:
    """(sum of direction^2, sum of gate_z^2 + sum of direction^2) under normalize=gated_rank,
    where advantage = gate_z (the gate's z-score, centred in each group) + direction (the
    rank term, the part the score decides). Bounded in [0, 1] as a ratio, unlike the rank
    term's share of the variance around group means, which its non-zero group means and its
    covariance with the gate can push past 1."""
    if len(gate_z) != len(directions):
        raise ValueError(f"{len(gate_z)} gate z-scores but {len(directions)} directions")
    d2 = float(sum(d * d for d in directions))
    return d2, float(sum(z * z for z in gate_z)) + d2


def broadcast_to_tokens(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence advantages [B] -> per-token [B, T], zero where `mask` [B, T] is 0."""
    return advantages[:, None].to(mask.device, torch.float32) * mask.to(torch.float32)
