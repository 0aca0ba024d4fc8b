"""Task-relative REINFORCE++ advantages (pure functions, no model).

Each trajectory's advantage is its reward normalized within its (task_type, role) group of the
batch: ``(r - mean_g) / std_g`` with the population std (ddof 0). A group whose std is below
`eps` (a singleton, or all rewards equal) gets advantage 0 for all its members, never NaN.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence

import torch

from compassplay.records import Trajectory


def group_normalized(rewards: Sequence[float], groups: Sequence[Hashable],
                     eps: float = 1e-6) -> list[float]:
    """Per-element advantage: reward normalized by the mean/std of its group."""
    if len(rewards) != len(groups):
        raise ValueError(f"{len(rewards)} rewards but {len(groups)} group keys")
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    adv = [0.0] * len(rewards)
    for idx in members.values():
        vals = [float(rewards[i]) for i in idx]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
        if std < eps:
            continue
        for i, v in zip(idx, vals, strict=True):
            adv[i] = (v - mean) / std
    return adv


def trajectory_advantages(trajs: Sequence[Trajectory], eps: float = 1e-6) -> list[float]:
    """Task-relative REINFORCE++: normalize rewards within each (task_type, role) group."""
    return group_normalized([t.reward for t in trajs], [(t.task_type, t.role) for t in trajs], eps)


def broadcast_to_tokens(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence advantages [B] -> per-token [B, T], zero where `mask` [B, T] is 0."""
    return advantages[:, None].to(mask.device, torch.float32) * mask.to(torch.float32)
