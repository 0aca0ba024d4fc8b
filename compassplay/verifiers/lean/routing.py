"""The Lean fleet's routing decisions, without Ray: how a batch of checks is split over the
placed verifier actors, how a batch whose actor died is sent again, and when actors that wait
for cluster resources are reported, dropped or given up on. `actors/lean/fleet_actor.py` is the
Ray shell that acts on them.

    split_checks(20, placed=3, checks_per_actor=8)   # [slice(0, 7), slice(7, 14), slice(14, 20)]
    policy = PlacementPolicy(resource_wait_s=600, log_every_s=10)
    policy.gives_up(oldest_wait_s=700, placed=0)     # True: no actor runs, none will be placed
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger(__name__)

RESUBMITS = 2  # times a batch whose LeanVerifier died is sent again

T = TypeVar("T")


def split_checks(n: int, placed: int, checks_per_actor: int) -> list[slice]:
    """Contiguous, near-equal parts of `n` checks: one per placed actor, but no part smaller
    than needed (ceil(n / checks_per_actor) parts at most); with no actor placed the whole
    batch is one part (it waits on one actor)."""
    if n <= 0:
        return []
    parts = max(1, min(placed, math.ceil(n / max(1, checks_per_actor))))
    size = math.ceil(n / parts)
    return [slice(i, min(n, i + size)) for i in range(0, n, size)]


class Resubmit(Exception):
    """A batch's LeanVerifier died (or was dropped): send the batch again."""


def with_resubmits(send: Callable[[], T], what: str, resubmits: int = RESUBMITS) -> T:
    """`send()`, again up to `resubmits` times while it raises Resubmit; then a RuntimeError
    naming `what` (e.g. '12 Lean checks') and the last cause."""
    for attempt in range(resubmits + 1):
        try:
            return send()
        except Resubmit as exc:
            if attempt == resubmits:
                raise RuntimeError(f"{what} failed {attempt + 1} times on the fleet: its "
                                   f"LeanVerifier died ({exc})") from exc
            log.warning("%s failed on the fleet (%s); resubmitting them (%d of %d)", what, exc,
                        attempt + 1, resubmits)
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class PlacementPolicy:
    """When to speak about LeanVerifier actors the cluster has not placed (seconds).

    resource_wait_s: give up (the run stops, or falls back to a local pool) when no actor is
    placed and the oldest has waited this long; 0 waits for an autoscaler forever, logging.
    log_every_s: how often the wait is logged; also how long an unplaced actor may hold
    checks while other actors run before it is dropped (its batch goes to the placed ones)."""

    resource_wait_s: float
    log_every_s: float = 10.0

    @property
    def drop_loaded_after_s(self) -> float:
        return min(self.resource_wait_s or self.log_every_s, self.log_every_s)

    def log_due(self, oldest_wait_s: float, now: float, last_log: float) -> bool:
        return oldest_wait_s >= self.log_every_s and now - last_log >= self.log_every_s

    def gives_up(self, oldest_wait_s: float, placed: int) -> bool:
        """True when no actor is placed and the oldest waited past resource_wait_s (with
        some placed the fleet runs smaller instead)."""
        return bool(self.resource_wait_s) and oldest_wait_s > self.resource_wait_s and not placed

    def waiting_message(self, n: int, oldest_wait_s: float, request: dict[str, float],
                        free: dict[str, float]) -> str:
        wait = self.resource_wait_s
        then = (f"giving up after {wait:.0f} s (verifiers.lean.resource_wait_s)" if wait
                else "waiting for an autoscaler (verifiers.lean.resource_wait_s=0)")
        return (f"{n} LeanVerifier actor(s) waiting for placement (oldest {oldest_wait_s:.0f} "
                f"s), each asks {request}; the cluster has free {free}; {then}")

    def give_up_message(self, n: int, request: dict[str, float], total: dict[str, float],
                        free: dict[str, float]) -> str:
        asked = {k: total.get(k, 0.0) for k in request}
        return (f"{n} LeanVerifier actor(s) not placed after {self.resource_wait_s:.0f} s: "
                f"each asks {request}, the cluster has {asked} in all and {free} free. Start "
                "nodes that advertise it (ray start --resources='{\"lean_repl\": 4}'; the "
                "lean_verifier node type of ray_cluster.yaml), change verifiers.lean.actor, "
                "raise verifiers.lean.resource_wait_s (0 = wait for an autoscaler) or set "
                "verifiers.lean.on_no_resource=local")
