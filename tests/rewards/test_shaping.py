"""reward.normalize=gated_rank: the class gate, the rank direction, and the advantages they
give (the cosine orders eligible tasks; copies pushed down; no lost contrasts)."""

from __future__ import annotations

import math
import random

import pytest

from compassplay.config import RewardSection, load_config
from compassplay.engines.training.advantages import (
    proposer_score_share,
    trajectory_advantages,
)
from compassplay.records import Generation, Score, Trajectory
from compassplay.rewards.shaping import (
    RANK_SCALE,
    ScoreWindow,
    gate_levels,
    gate_of,
    mid_ranks,
    shape,
)

GEN = Generation(prompt_ids=[1], completion_ids=[2], logprobs=[-1.0], text="x")


def _score(tid: str, gate: str, reward: float, kind: str = "cosine") -> Score:
    return Score(task_id=tid, reward=reward, kind=kind, eligible=gate in ("eligible", "copy"),
                 solve_rate=0.5, gate=gate)


def _advantages(scores: list[Score], cfg: RewardSection, window: ScoreWindow | None = None,
                task_type: str = "deduction") -> dict[str, float]:
    """Proposer advantages of one group under `cfg.normalize` (the learner's arithmetic)."""
    trajs = _trajectories(scores, cfg, window, task_type)
    return dict(zip((s.task_id for s in scores), trajectory_advantages(trajs), strict=True))


def _trajectories(scores: list[Score], cfg: RewardSection, window: ScoreWindow | None = None,
                  task_type: str = "deduction") -> list[Trajectory]:
    """Proposer trajectories of one group as `stages.make_trajectories` builds them."""
    shaped = None
    if cfg.normalize == "gated_rank":
        levels = gate_levels(cfg.format_penalty, cfg.invalid_penalty, cfg.ineligible_reward,
                             cfg.copy_reward)
        shaped = shape(scores, levels, window or ScoreWindow(cfg.rank_window), cfg.rank_weight)
    trajs = [Trajectory(generation=GEN, reward=s.reward, role="proposer", task_type=task_type,
                        task_id=s.task_id,
                        subgroup="eligible" if cfg.normalize == "eligible" and s.eligible else "",
                        gate=shaped[s.task_id].gate if shaped else None,
                        direction=shaped[s.task_id].direction if shaped else 0.0)
             for s in scores]
    return trajs


def test_mid_ranks_and_ties():
    assert mid_ranks([1.0, 2.0, 3.0, 4.0], [1.0, 4.0]) == [0.125, 0.875]
    assert mid_ranks([0.5, 0.5, 0.5, 0.9], [0.5]) == [0.375]
    with pytest.raises(ValueError, match="not in the rank pool"):
        mid_ranks([1.0], [2.0])


def test_window_ranks_a_lone_candidate_against_recent_scores():
    w = ScoreWindow(4)
    assert w.directions([0.3]) == [0.0]  # nothing to compare with yet: no direction
    w.directions([0.1, 0.2, 0.4])
    assert w.directions([0.5])[0] == pytest.approx(RANK_SCALE * (2 * 4.5 / 5 - 1))
    assert w.directions([-1.0])[0] < 0  # alone in its step, still told it points the wrong way
    assert list(w.scores) == [0.2, 0.4, 0.5, -1.0]  # the oldest left first
    state = w.state_dict()
    fresh = ScoreWindow(4)
    fresh.load_state_dict(state)
    assert fresh.directions([0.3]) == w.directions([0.3])


def test_window_zero_ranks_within_the_step_only():
    w = ScoreWindow(0)
    assert w.directions([0.9]) == [0.0]
    d = w.directions([0.1, 0.9])
    assert d[0] == pytest.approx(-RANK_SCALE / 2) and d[1] == pytest.approx(RANK_SCALE / 2)
    assert not w.scores


def test_directions_are_bounded_and_nan_is_refused():
    w = ScoreWindow(64)
    rng = random.Random(0)
    for _ in range(20):
        d = w.directions([rng.gauss(0, 0.02) for _ in range(rng.randrange(1, 6))])
        assert all(abs(x) < RANK_SCALE for x in d)
    with pytest.raises(ValueError, match="NaN"):
        w.directions([math.nan])


def test_gate_classes():
    assert gate_of(parse_fail=True, valid=False, eligible=False, kind="cosine",
                   novelty=None) == "unparsed"
    assert gate_of(parse_fail=False, valid=False, eligible=False, kind="cosine",
                   novelty=None) == "invalid"
    assert gate_of(parse_fail=False, valid=True, eligible=False, kind="cos_novelty",
                   novelty=0.0) == "ineligible"
    assert gate_of(parse_fail=False, valid=True, eligible=True, kind="cos_novelty",
                   novelty=0.0) == "copy"
    # the plain cosine has no zero-reward class: its copies are what the ablation measures
    assert gate_of(parse_fail=False, valid=True, eligible=True, kind="cosine",
                   novelty=0.0) == "eligible"


def test_the_cosine_orders_eligible_tasks_where_the_plain_form_did_not():
    """The issue's step 1: two eligible tasks with cos -0.029 and +0.030 both got exactly
    +1.732 under `all` (each alone in its class); gated_rank orders them by the cosine."""
    scores = [_score("a", "eligible", -0.029), _score("b", "eligible", 0.030),
              _score("c", "ineligible", -0.5), _score("d", "ineligible", -0.5),
              _score("e", "invalid", -1.0), _score("f", "invalid", -1.0)]
    plain = _advantages(scores, RewardSection(kind="cosine", normalize="all"))
    assert plain["b"] - plain["a"] == pytest.approx(0.06 / 0.39, rel=0.2)  # scale of 0.06
    gated = _advantages(scores, RewardSection(kind="cosine"))
    assert gated["b"] - gated["a"] == pytest.approx(RANK_SCALE)  # u = 1/4 against 3/4
    assert gated["a"] > gated["c"] > gated["e"]  # the gate still orders the classes


def test_a_group_of_equal_rewards_keeps_its_contrast_where_the_gate_differs():
    """Rewards all -0.5 under the older penalties (ineligible 0 ... here: an invalid proposal
    at -0.5 and ineligible ones at -0.5) give std 0 and no gradient; the gate levels are
    ordered, so the gated group keeps its contrast."""
    scores = [_score("a", "invalid", -0.5), _score("b", "ineligible", -0.5),
              _score("c", "ineligible", -0.5), _score("d", "ineligible", -0.5)]
    assert set(_advantages(scores, RewardSection(kind="cosine", normalize="all",
                                                 invalid_penalty=-0.5)).values()) == {0.0}
    gated = _advantages(scores, RewardSection(kind="cosine"))
    assert gated["a"] < 0 < gated["b"] == gated["c"] == gated["d"]
    with pytest.raises(ValueError, match="reward.ineligible_reward"):
        RewardSection(invalid_penalty=-0.5, ineligible_reward=-0.5)


def _lean_batch(rng: random.Random, n: int = 16) -> list[Score]:
    """A cos_novelty proposal batch of the paper Lean config's classes: unparsed, ill-posed,
    ineligible (s in {0, 1}), copies (novelty 0: reward 0), eligible (cos x novelty)."""
    out = []
    for i in range(n):
        u = rng.random()
        if u < 0.15:
            out.append(_score(f"t{i}", "unparsed", -1.0, "cos_novelty"))
        elif u < 0.30:
            out.append(_score(f"t{i}", "invalid", -1.0, "cos_novelty"))
        elif u < 0.60:
            out.append(_score(f"t{i}", "ineligible", -0.5, "cos_novelty"))
        elif u < 0.80:
            out.append(_score(f"t{i}", "copy", 0.0, "cos_novelty"))
        else:
            out.append(_score(f"t{i}", "eligible", rng.uniform(-0.05, 0.15) * rng.random(),
                              "cos_novelty"))
    return out


def test_lean_copies_are_pushed_down_under_the_paper_config():
    cfg = load_config("paper_lean_7b").reward
    assert cfg.normalize == "gated_rank" and cfg.kind == "cos_novelty"
    plain = cfg.model_copy(update={"normalize": "all"})
    rng = random.Random(1)
    window = ScoreWindow(cfg.rank_window)
    plain_positive = batches = 0
    for _ in range(200):
        scores = _lean_batch(rng)
        copies = [s.task_id for s in scores if s.gate == "copy"]
        if not copies or len({s.gate for s in scores}) < 2:
            continue
        batches += 1
        gated = _advantages(scores, cfg, window, "lean_prove")
        assert all(gated[c] < 0 for c in copies)
        old = _advantages(scores, plain, None, "lean_prove")
        plain_positive += all(old[c] > 0 for c in copies)
    assert batches > 150
    assert plain_positive > 0.9 * batches  # the plain form reinforced the copies


def test_copy_reward_must_sit_below_the_eligible_gate():
    with pytest.raises(ValueError, match="reward.copy_reward"):
        RewardSection(copy_reward=0.0)
    RewardSection(copy_reward=0.0, normalize="all")  # the plain form keeps the copies at 0


def test_legacy_configs_keep_the_plain_form():
    cfg = RewardSection.model_validate({"azr_compat": False, "kind": "cosine"})
    assert cfg.normalize == "all" and cfg.ineligible_reward == 0.0


def test_score_share_rises_when_the_gate_carries_the_classes():
    """The cosine's share of the advantage variance on a batch of the recorded class mix
    (21% invalid, 58% ineligible, 21% eligible, cosines s.d. 0.02)."""
    rng = random.Random(0)
    cfg_plain, cfg_gated = RewardSection(kind="cosine", normalize="all"), RewardSection()
    window = ScoreWindow(cfg_gated.rank_window)
    shares = {"all": [], "gated_rank": []}
    for step in range(30):
        scores = []
        for i in range(16):
            u = rng.random()
            gate = "invalid" if u < 0.21 else "ineligible" if u < 0.79 else "eligible"
            r = {"invalid": -1.0, "ineligible": -0.5}.get(gate, rng.gauss(0.01, 0.02))
            scores.append(_score(f"s{step}-{i}", gate, r))
        eligible = {s.task_id for s in scores if s.eligible}
        for cfg in (cfg_plain, cfg_gated):
            trajs = _trajectories(scores, cfg, window if cfg is cfg_gated else None)
            shares[cfg.normalize].append(proposer_score_share(trajs, eligible))
    mean = {k: sum(v) / len(v) for k, v in shares.items()}
    assert mean["all"] < 0.01
    assert mean["gated_rank"] > 10 * mean["all"]


def test_gated_share_counts_a_lone_eligible_task():
    """One eligible task per group: no variance among eligible tasks of a group, but its rank
    term is the score's part of the advantage (0 only where the rank is the median)."""
    cfg = RewardSection()
    window = ScoreWindow(cfg.rank_window)
    window.directions([0.0, 0.01, 0.02, 0.03])
    scores = [_score("a", "eligible", 0.05), _score("b", "ineligible", -0.5),
              _score("c", "invalid", -1.0)]
    trajs = _trajectories(scores, cfg, window)
    adv = trajectory_advantages(trajs)
    share = proposer_score_share(trajs, {"a"})
    d = trajs[0].direction
    z = [a - t.direction for a, t in zip(adv, trajs, strict=True)]
    assert sum(z) == pytest.approx(0.0)  # the gate part is centred in the group
    assert d > 0 and share == pytest.approx(d * d / (sum(x * x for x in z) + d * d))
    plain = _trajectories(scores, cfg.model_copy(update={"normalize": "all"}))
    assert proposer_score_share(plain, {"a"}) == 0.0
