"""LeanScaler: backlog -> target actor count, immediate growth, shrinking after a grace."""

from __future__ import annotations

import pytest

from compassplay.config import load_config
from compassplay.verifiers.lean.scaling import LeanScaler


def test_demand_is_backlog_over_capacity_clamped() -> None:
    s = LeanScaler(min_actors=1, max_actors=4, checks_per_actor=8, idle_grace_s=10)
    assert [s.demand(b) for b in (0, 1, 8, 9, 24, 25, 1000)] == [1, 1, 1, 2, 3, 4, 4]


def test_grows_at_once_and_shrinks_after_grace_with_hysteresis() -> None:
    s = LeanScaler(min_actors=0, max_actors=8, checks_per_actor=4, idle_grace_s=10)
    assert s.decide(backlog=20, current=0, now=0.0) == 5       # immediate growth
    assert s.decide(backlog=3, current=5, now=1.0) == 5        # below, grace starts
    assert s.decide(backlog=9, current=5, now=6.0) == 5        # still below (3 actors)
    assert s.decide(backlog=0, current=5, now=10.9) == 5       # grace not over
    assert s.decide(backlog=0, current=5, now=11.0) == 3       # peak demand of the window
    assert s.decide(backlog=0, current=3, now=12.0) == 3       # grace restarts after a step
    assert s.decide(backlog=0, current=3, now=22.0) == 0
    # A burst during the grace resets it.
    assert s.decide(backlog=0, current=2, now=30.0) == 2
    assert s.decide(backlog=8, current=2, now=35.0) == 2       # demand == current: reset
    assert s.decide(backlog=0, current=2, now=44.0) == 2       # a new 10 s grace from 44
    assert s.decide(backlog=0, current=2, now=54.0) == 0


def test_bounds_and_bad_input() -> None:
    s = LeanScaler(min_actors=2, max_actors=3, checks_per_actor=1, idle_grace_s=0)
    assert s.decide(0, current=0, now=0) == 2                  # up to the floor at once
    assert s.decide(100, current=2, now=1) == 3
    assert s.decide(100, current=6, now=2) == 3                # above max: shrink at once
    assert s.decide(0, current=3, now=3) == 2                  # zero grace
    with pytest.raises(ValueError, match="min_actors <= max_actors"):
        LeanScaler(min_actors=3, max_actors=2)
    with pytest.raises(ValueError, match="checks_per_actor"):
        LeanScaler(checks_per_actor=0)
    with pytest.raises(ValueError, match="backlog"):
        s.decide(-1, current=1, now=0)


def test_from_config() -> None:
    cfg = load_config(None, ["verifiers.lean.scaling.max_actors=3"]).verifiers.lean.scaling
    s = LeanScaler.from_config(cfg)
    assert (s.min_actors, s.max_actors, s.checks_per_actor, s.idle_grace_s) == (0, 3, 8, 60.0)
