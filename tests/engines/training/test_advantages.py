from __future__ import annotations

import math

import pytest
import torch

from compassplay.engines.training.advantages import (
    broadcast_to_tokens,
    group_normalized,
    trajectory_advantages,
)
from tests.engines.helpers import make_traj


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


def test_a_labelled_subgroup_keeps_its_contrast_and_gets_unit_spread():
    # one task type: a parse failure, an ill-posed and an ineligible proposal, 3 eligible
    rewards = [-1.0, -1.0, -0.5, 0.01, 0.03, 0.02]
    labels = ["", "", "", "eligible", "eligible", "eligible"]
    plain = group_normalized(rewards, ["g"] * 6)
    adv = group_normalized(rewards, ["g"] * 6, subgroups=labels)
    assert adv[:3] == pytest.approx(plain[:3])  # the other classes are unchanged
    mean, std = sum(rewards) / 6, math.sqrt(sum((r - sum(rewards) / 6) ** 2 for r in rewards) / 6)
    between = (0.02 - mean) / std  # the eligible class keeps its contrast with the group
    sub_std = math.sqrt((0.01 ** 2 + 0.01 ** 2) / 3)
    assert adv[3:] == pytest.approx([between - 0.01 / sub_std, between + 0.01 / sub_std,
                                     between])
    assert sum(adv) == pytest.approx(0.0, abs=1e-12)
    # plain: the cosine's spread is divided by the penalties' std, a ~50 times smaller push
    assert (plain[4] - plain[3]) * 50 < adv[4] - adv[3]


def test_small_or_flat_subgroups_and_other_groups_keep_the_plain_advantage():
    rewards, groups = [-1.0, 0.2, 0.0, 0.3, 0.3, 1.0, 2.0], ["a", "a", "a", "b", "b", "c", "c"]
    labels = ["", "eligible", "", "eligible", "eligible", "", ""]
    assert group_normalized(rewards, groups, subgroups=labels) == pytest.approx(
        group_normalized(rewards, groups))
    with pytest.raises(ValueError, match="subgroup"):
        group_normalized([1.0, 2.0], ["a", "a"], subgroups=["x"])


def test_trajectory_subgroups_are_taken_within_task_type_and_role():
    trajs = [make_traj([1], [2], r, "proposer", "deduction") for r in (-1.0, 0.01, 0.03)]
    trajs = [t.model_copy(update={"subgroup": "eligible" if t.reward > 0 else ""})
             for t in trajs]
    adv = trajectory_advantages(trajs)
    assert adv[2] - adv[1] == pytest.approx(2.0)  # two eligible: z-scores -1 and +1
    assert adv[0] == pytest.approx(group_normalized([-1.0, 0.01, 0.03], ["g"] * 3)[0])


def test_fixed_advantages_are_kept_and_left_out_of_the_groups():
    """solver.train_on=selected: supervised examples keep +1 and do not move the statistics
    of the normalized trajectories beside them."""
    free = [make_traj([1], [2], r, "solver", "lean_prove") for r in (1.0, 0.0, 0.0)]
    fixed = [t.model_copy(update={"advantage": 1.0, "reward": 5.0}) for t in free[:2]]
    adv = trajectory_advantages(free + fixed)
    assert adv[:3] == pytest.approx(trajectory_advantages(free))
    assert adv[3:] == [1.0, 1.0]
    assert trajectory_advantages(fixed) == [1.0, 1.0]
