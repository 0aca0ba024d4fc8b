"""How many Lean verifier actors to run for a backlog: a pure decision with hysteresis.

    scaler = LeanScaler(min_actors=0, max_actors=8, checks_per_actor=8, idle_grace_s=60)
    target = scaler.decide(backlog=30, current=2, now=time.monotonic())   # -> 4

Demand is `ceil(backlog / checks_per_actor)` clamped to [min_actors, max_actors]. Growing is
immediate (a pending actor is what makes the Ray autoscaler add a Lean node). Shrinking waits
until demand has stayed below the current count for `idle_grace_s` seconds, then goes to the
highest demand seen during that window, and the grace restarts: bursts a few seconds apart
keep their actors (and their warm Mathlib environments).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any


class LeanScaler:
    """Target actor count from backlog; state is the recent demand window only."""

    def __init__(self, min_actors: int = 0, max_actors: int = 8, checks_per_actor: int = 8,
                 idle_grace_s: float = 60.0) -> None:
        if min_actors < 0 or max_actors < 1 or min_actors > max_actors:
            raise ValueError(f"need 0 <= min_actors <= max_actors and max_actors >= 1, got "
                             f"min_actors={min_actors}, max_actors={max_actors}")
        if checks_per_actor < 1 or idle_grace_s < 0:
            raise ValueError("need checks_per_actor >= 1 and idle_grace_s >= 0")
        self.min_actors = min_actors
        self.max_actors = max_actors
        self.checks_per_actor = checks_per_actor
        self.idle_grace_s = float(idle_grace_s)
        self._below_since: float | None = None
        self._window: deque[tuple[float, int]] = deque()

    @classmethod
    def from_config(cls, cfg: Any) -> LeanScaler:
        """Build from a `compassplay.config.LeanScalingSection`."""
        return cls(cfg.min_actors, cfg.max_actors, cfg.checks_per_actor, cfg.idle_grace_s)

    def demand(self, backlog: int) -> int:
        """Actors the backlog asks for, clamped to [min_actors, max_actors]."""
        if backlog < 0:
            raise ValueError(f"backlog must be >= 0, got {backlog}")
        need = math.ceil(backlog / self.checks_per_actor)
        return max(self.min_actors, min(self.max_actors, need))

    def decide(self, backlog: int, current: int, now: float) -> int:
        """Target count given the backlog (checks submitted, not finished), the current actor
        count and the time `now` (s, monotonic)."""
        if current < 0:
            raise ValueError(f"current must be >= 0, got {current}")
        want = self.demand(backlog)
        if want >= current or current > self.max_actors:
            self._reset()
            return want if want >= current else self.max_actors
        if self._below_since is None:
            self._below_since = now
        self._window.append((now, want))
        while self._window and self._window[0][0] < now - self.idle_grace_s:
            self._window.popleft()
        if now - self._below_since < self.idle_grace_s:
            return current
        target = max([w for _, w in self._window] or [want])
        self._reset()
        return target

    def _reset(self) -> None:
        self._below_since = None
        self._window.clear()
