"""The Lean fleet's pure routing decisions (verifiers/lean/routing.py)."""

from __future__ import annotations

import logging

import pytest

from compassplay.verifiers.lean.routing import (
    PlacementPolicy,
    Resubmit,
    split_checks,
    with_resubmits,
)


def _covered(parts: list[slice], n: int) -> list[int]:
    return [i for p in parts for i in range(n)[p]]


@pytest.mark.parametrize("n,placed,per_actor,sizes", [
    (20, 3, 8, [7, 7, 6]),   # one part per placed actor
    (20, 8, 8, [7, 7, 6]),   # no more parts than ceil(20 / 8) = 3
    (5, 4, 8, [5]),          # a small batch stays whole
    (9, 0, 8, [9]),          # none placed: the whole batch waits on one actor
    (16, 4, 1, [4, 4, 4, 4]),
    (1, 5, 1, [1]),
])
def test_split_checks_covers_the_batch_in_order(n, placed, per_actor, sizes):
    parts = split_checks(n, placed, per_actor)
    assert [p.stop - p.start for p in parts] == sizes
    assert _covered(parts, n) == list(range(n))


def test_split_checks_of_nothing_is_empty():
    assert split_checks(0, 3, 8) == []


def test_with_resubmits_sends_again_then_names_the_batch(caplog):
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise Resubmit("ActorDiedError")
        return "verdicts"

    with caplog.at_level(logging.WARNING):
        assert with_resubmits(flaky, "12 Lean checks", resubmits=2) == "verdicts"
    assert len(calls) == 3
    assert "12 Lean checks failed on the fleet (ActorDiedError); resubmitting them (2 of 2)" \
        in caplog.text

    def dead() -> str:
        raise Resubmit("ActorDiedError")

    with pytest.raises(RuntimeError, match=r"4 Lean checks failed 2 times on the fleet: its "
                                           r"LeanVerifier died \(ActorDiedError\)"):
        with_resubmits(dead, "4 Lean checks", resubmits=1)


def test_with_resubmits_lets_other_errors_through_at_once():
    calls = []

    def broken() -> None:
        calls.append(1)
        raise ValueError("bad check")

    with pytest.raises(ValueError, match="bad check"):
        with_resubmits(broken, "1 Lean check")
    assert calls == [1]


def test_placement_policy_logs_drops_and_gives_up_on_time():
    p = PlacementPolicy(resource_wait_s=60, log_every_s=10)
    assert p.drop_loaded_after_s == 10
    assert not p.log_due(oldest_wait_s=5, now=100, last_log=0)      # not waited long yet
    assert p.log_due(oldest_wait_s=12, now=100, last_log=0)
    assert not p.log_due(oldest_wait_s=30, now=100, last_log=95)    # logged 5 s ago
    assert not p.gives_up(oldest_wait_s=59, placed=0)
    assert p.gives_up(oldest_wait_s=61, placed=0)
    assert not p.gives_up(oldest_wait_s=600, placed=1)              # the fleet runs smaller
    forever = PlacementPolicy(resource_wait_s=0, log_every_s=10)
    assert not forever.gives_up(oldest_wait_s=1e6, placed=0)
    assert forever.drop_loaded_after_s == 10
    assert PlacementPolicy(resource_wait_s=3, log_every_s=10).drop_loaded_after_s == 3


def test_placement_messages_say_what_is_asked_and_what_to_change():
    p = PlacementPolicy(resource_wait_s=60)
    msg = p.give_up_message(2, {"CPU": 1.0, "lean_repl": 1.0}, {"CPU": 2.0}, {"CPU": 0.5})
    assert "2 LeanVerifier actor(s) not placed after 60 s" in msg
    assert "{'CPU': 2.0, 'lean_repl': 0.0} in all" in msg
    assert "verifiers.lean.on_no_resource=local" in msg
    wait = p.waiting_message(1, 12.4, {"lean_repl": 1.0}, {"CPU": 2.0})
    assert "oldest 12 s" in wait and "giving up after 60 s" in wait
    assert "waiting for an autoscaler" in PlacementPolicy(0).waiting_message(1, 30, {}, {})
