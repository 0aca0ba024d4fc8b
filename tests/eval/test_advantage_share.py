"""The cosine's share of the proposer advantage variance under each reward.normalize."""

from __future__ import annotations

import json

import pytest

from compassplay.config import RewardSection
from compassplay.eval import advantage_share as A


def test_share_under_all_is_the_cosine_variance_over_the_group_variance():
    rewards = [-1.0, -1.0, -0.5, -0.5, 0.01, 0.03, 0.02, 0.0]
    eligible = [False] * 4 + [True] * 4
    within, total = A.cosine_share(rewards, eligible, ["g"] * 8, "all")
    mean = sum(rewards) / 8
    var = sum((r - mean) ** 2 for r in rewards) / 8
    cos = rewards[4:]
    var_e = sum((c - 0.015) ** 2 for c in cos) / 4
    assert within / total == pytest.approx(0.5 * var_e / var)  # (n_e / n) var_e / var
    w_el, t_el = A.cosine_share(rewards, eligible, ["g"] * 8, "eligible")
    assert w_el == pytest.approx(4.0)  # unit spread among the 4 eligible candidates
    assert w_el / t_el > 100 * within / total


def test_measure_recomputes_rewards_and_resamples_deterministically(tmp_path):
    rows = [{"step": 0, "task_type": "deduction", "valid": False,
             "invalid_reason": "parse:no_block", "solve_rate": None, "cosine": None},
            {"step": 0, "task_type": "deduction", "valid": False,
             "invalid_reason": "runtime_error", "solve_rate": None, "cosine": None},
            {"step": 0, "task_type": "deduction", "valid": True, "invalid_reason": "",
             "solve_rate": 1.0, "cosine": None},
            {"step": 0, "task_type": "deduction", "valid": True, "invalid_reason": "",
             "solve_rate": 0.5, "cosine": 0.02},
            {"step": 0, "task_type": "deduction", "valid": True, "invalid_reason": "",
             "solve_rate": 0.25, "cosine": -0.01}]
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    props = A.load_rows([path])
    cfg = RewardSection(invalid_penalty=-0.5, ineligible_reward=0.0, normalize="all")
    assert [A.reward_of(p, cfg) for p in props] == [-1.0, -0.5, 0.0, 0.02, -0.01]
    out = A.measure(props, RewardSection(), per_type=16, batches=5)
    assert out["eligible"] == 2 and out["batches"] == 1
    got = out["resampled_16_per_type"]
    assert 0.0 < got["all"] < got["eligible"] < 1.0
    assert A.measure(props, RewardSection(), per_type=16, batches=5) == out


def test_gated_rank_share_on_recorded_rows_beats_the_plain_form(tmp_path):
    """Two steps of the recorded class mix: the gate carries the classes, the rank the
    cosine; a configuration whose penalties cannot be gates reports no gated figure."""
    rows = []
    for step in range(2):
        for i, (valid, reason, s, cos) in enumerate([
                (False, "parse:no_block", None, None), (False, "runtime_error", None, None),
                (True, "", 1.0, None), (True, "", 0.0, None),
                (True, "", 0.5, 0.02 - 0.01 * step), (True, "", 0.25, -0.01 + 0.03 * step)]):
            rows.append({"step": step, "task_type": "deduction", "valid": valid,
                         "invalid_reason": reason, "solve_rate": s, "cosine": cos, "i": i})
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    props = A.load_rows([path])
    shares = A.batch_shares(props, RewardSection())
    assert shares["all"] < 0.01 < 0.1 < shares["gated_rank"] < 1.0
    old = A.batch_shares(props, RewardSection(invalid_penalty=-0.5, ineligible_reward=0.0,
                                              normalize="all"))
    assert "gated_rank" not in old and old["all"] > 0.0
