from __future__ import annotations

import math

import pytest
import torch

from compassplay.engines.advantages import (
    broadcast_to_tokens,
    group_normalized,
    trajectory_advantages,
)

from .helpers import make_traj


def test_hand_computed_groups():
    adv = group_normalized([1.0, 0.0, 3.0, 5.0], ["a", "a", "b", "b"])
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0])
    adv = group_normalized([0.0, 0.0, 3.0], ["a", "a", "a"])
    std = math.sqrt(((0 - 1) ** 2 * 2 + (3 - 1) ** 2) / 3)
    assert adv == pytest.approx([-1 / std, -1 / std, 2 / std])


def test_singleton_and_zero_std_groups_are_zero():
    adv = group_normalized([7.0, 2.0, 2.0, 2.0], ["single", "flat", "flat", "flat"])
    assert adv == [0.0, 0.0, 0.0, 0.0]
    assert not any(math.isnan(a) for a in adv)


def test_groups_are_task_type_and_role():
    trajs = [make_traj([1], [2], 1.0, "solver", "deduction"),
             make_traj([1], [2], 0.0, "solver", "deduction"),
             make_traj([1], [2], 1.0, "proposer", "deduction"),
             make_traj([1], [2], 1.0, "solver", "induction")]
    assert trajectory_advantages(trajs) == pytest.approx([1.0, -1.0, 0.0, 0.0])


def test_broadcast():
    out = broadcast_to_tokens(torch.tensor([2.0, -1.0]), torch.tensor([[1, 1, 0], [0, 1, 1]]))
    assert out.tolist() == [[2.0, 2.0, 0.0], [0.0, -1.0, -1.0]]
