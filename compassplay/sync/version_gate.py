"""Which weights a rollout may use under bounded staleness (after AReaL's staleness manager).

The learner reports each new version as a snapshot right after `learn(k)` is submitted
(`report(k, snapshot)`); a snapshot is whatever the executor uses to hand weights over (in
process: the version and a copy of the state; on Ray: ObjectRefs the learner filled). The
rollout of step k may use the weights after learn(k - staleness - 1): staleness 0 is
synchronous, staleness 1 lets rollout of k+1 overlap scoring and learning of k. At most
`staleness + 1` steps are in flight.
"""

from __future__ import annotations

from typing import Generic, TypeVar

S = TypeVar("S")


class VersionGate(Generic[S]):
    """Holds the snapshots a future rollout may still need; answers which one a step uses."""

    def __init__(self, staleness: int) -> None:
        if staleness < 0:
            raise ValueError(f"pipeline.staleness must be >= 0, got {staleness}")
        self.staleness = staleness
        self._after: dict[int, S] = {}  # snapshot after learn(step), by step

    def reset(self, after_step: int, snapshot: S) -> None:
        """Start (or restart after a rollback) from the weights after `after_step` (-1: none)."""
        self._after = {after_step: snapshot}

    def report(self, step: int, snapshot: S) -> None:
        """The learner's weights after learn(`step`); forgets what no rollout can use."""
        self._after[step] = snapshot
        horizon = step - self.staleness
        self._after = {k: v for k, v in self._after.items() if k >= horizon - 1}

    def for_rollout(self, step: int) -> S:
        """The snapshot rollout `step` uses: the newest after learn(<= step - staleness - 1)."""
        if not self._after:
            raise RuntimeError("VersionGate.for_rollout before reset()")
        due = step - self.staleness - 1
        usable = [k for k in self._after if k <= due]
        return self._after[max(usable) if usable else min(self._after)]

    def snapshots(self) -> list[S]:
        """The snapshots still held (oldest step first)."""
        return [self._after[k] for k in sorted(self._after)]

    def may_submit(self, in_flight: int) -> bool:
        """Whether another step may start while `in_flight` steps are unfinished."""
        return in_flight <= self.staleness
